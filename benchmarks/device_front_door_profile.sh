#!/usr/bin/env bash
# Where the front door's host time goes under load: the server's process under cProfile (its engine core is not
# profiled) while the load generator sends mixed calls at RATE req/s for 30 s (default 60). The profiler slows the
# process about twice, so the figures are shares of its time, not rates. Writes $OUT/front-door/server.prof, the
# tables by own and by cumulative time in profile.txt, and the process's CPU seconds over the load in cpu.txt.
#     bash benchmarks/device_front_door_profile.sh 60
set -u
source benchmarks/device_server.sh
rate=${1:-60}
out=$OUT/front-door
port=50161
SERVER_PROFILE=$out/server.prof start_server "$out" random:1.7b-custom_voice "$port" --max-calls-per-caller 100000
before=$(server_cpu_seconds)
python3 -m clients.loadgen --server "127.0.0.1:$port" --rate "$rate" --duration 30 --rpc mixed --seed 1 --processes 2 \
    --out "$out/lg-$rate.json.gz" | tee "$out/loadgen.txt"
echo "server user/system CPU seconds before the load: $before, after: $(server_cpu_seconds)" | tee "$out/cpu.txt"
stop_server
python3 - "$out/server.prof" > "$out/profile.txt" <<'PY'
import pstats
import sys
stats = pstats.Stats(sys.argv[1])
stats.sort_stats("tottime").print_stats(45)
stats.sort_stats("cumtime").print_stats(r"tts_service|observability|grpc|scheduler|clients", 70)
PY
python3 -m benchmarks.loadgen_summaries "$out"
rm -f "$out/server.log"
