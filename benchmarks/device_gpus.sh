#!/usr/bin/env bash
# One server over one GPU, then over several, on the same machine: how the clean rate grows with the GPUs behind
# one front door (issue 44's >= 1.9x on two H100s). For each COUNT:RATES, a server on random 1.7B CustomVoice
# weights over the first COUNT GPUs (--device cuda:0,...,cuda:COUNT-1: an engine core each), driven by the load
# generator (mixed calls, open loop, 30 s a rate) with its schedule shared over PROCESSES worker processes (default
# 4), so that the client's own lag stays out of the figures (each summary's start_lag_ms says whether it did).
# Summaries in $OUT/gpus-COUNT/summary.json, the per-rate tables in $OUT/gpus-COUNT/loadgen.txt, and the server
# process's CPU seconds around each rate in $OUT/gpus-COUNT/cpu.txt (a front door near one core's worth is the limit).
#     PROCESSES=4 bash benchmarks/device_gpus.sh 1:60,75,90 2:120,150,180
set -u
source benchmarks/device_server.sh  # installs the carried wheels into /tmp/site
processes=${PROCESSES:-4}
port=50151
for spec in "$@"; do
  count=${spec%%:*}; rates=${spec#*:}
  devices=$(seq -s, -f "cuda:%g" 0 $((count - 1)))
  out=$OUT/gpus-$count
  start_server "$out" random:1.7b-custom_voice "$port" --device "$devices" --max-calls-per-caller 100000
  for rate in ${rates//,/ }; do
    before=$(server_cpu_seconds)
    python3 -m clients.loadgen --server "127.0.0.1:$port" --rate "$rate" --duration 30 --rpc mixed --seed 1 \
        --processes "$processes" --out "$out/lg-$rate.json.gz" | tee -a "$out/loadgen.txt"
    echo "$rate req/s: server user/system CPU seconds $before before, $(server_cpu_seconds) after" | tee -a "$out/cpu.txt"
  done
  stop_server
  server_log_faults "$out/server.log"
  python3 -m benchmarks.loadgen_summaries "$out"
  rm -f "$out/server.log"
done
