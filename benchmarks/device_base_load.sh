#!/usr/bin/env bash
# A registered in-context voice under load (issue 44's Base target: 20 req/s, p95 first audio <= 40 ms, no
# underrun): a server on random 1.7B Base weights, one voice registered from a 10 s reference with its transcript
# (benchmarks.voice_ttfa's test signal), then the load generator at each rate (mixed calls, open loop, 30 s) with
# every request in that voice; with `inline`, every request sends the reference itself instead. Summaries in
# $OUT/base-registered/summary.json (or base-inline), the table in loadgen.txt beside it.
#     bash benchmarks/device_base_load.sh 20,40 [registered|inline]
# Wheels as benchmarks/device_server.sh says (carry .whl after benchmarks/fetch_wheels.sh site grpc otel).
set -euo pipefail
rates=${1:?usage: device_base_load.sh RATES [registered|inline]}
mode=${2:-registered}
[[ $mode == registered || $mode == inline ]] || { echo "the voice is registered or inline, not $mode" >&2; exit 2; }
port=50153
out=$OUT/base-$mode
# shellcheck source=benchmarks/device_server.sh
source benchmarks/device_server.sh
start_server "$out" random:1.7b-base "$port" --max-calls-per-caller 100000
python3 -c "import sys; from benchmarks.voice_ttfa import reference_wav; sys.stdout.buffer.write(reference_wav(10.0))" \
    > "$out/reference.wav"
text=$(python3 -c 'from benchmarks.voice_ttfa import REFERENCE_TEXT; print(REFERENCE_TEXT)')
if [[ $mode == registered ]]; then
  voice=$(python3 -m clients.qwen3_tts_client.cli --server "127.0.0.1:$port" voice create \
      --reference-audio "$out/reference.wav" --reference-text "$text")
  echo "registered voice $voice"
  voice_flags=(--voice-id "$voice")
else
  voice_flags=(--reference-audio "$out/reference.wav" --reference-text "$text")
fi
for rate in ${rates//,/ }; do
  python3 -m clients.loadgen --server "127.0.0.1:$port" --rate "$rate" --duration 30 --rpc mixed --seed 1 \
      "${voice_flags[@]}" --out "$out/lg-$rate.json.gz" | tee -a "$out/loadgen.txt"
done
stop_server
server_log_faults "$out/server.log" || true
python3 -m benchmarks.loadgen_summaries "$out"
rm -f "$out/server.log" "$out/reference.wav"
