#!/usr/bin/env bash
# Issue 14's "over gRPC, at least 90% of the in-process audio seconds per second at the same concurrency", on a GPU
# machine with no network: the real server on random 1.7B weights in a closed loop (SynthesizeOnline, the load
# generator's texts), then, with the server stopped, the engine in process on the same requests; the comparison
# goes to OUT_DIR/ceiling.json.
#     bash benchmarks/device_ceiling.sh OUT_DIR [CONCURRENCIES] [REQUESTS_PER_LEVEL]
# Wheels the machine lacks travel in .whl/ as for benchmarks/device_loadgen.sh (.whl/site, .whl/grpc, .whl/otel).
set -euo pipefail
out=${1:?usage: device_ceiling.sh OUT_DIR [CONCURRENCIES] [REQUESTS_PER_LEVEL]}
levels=${2:-32,128}
requests=${3:-1024}
port=50151
# shellcheck source=benchmarks/device_server.sh
source benchmarks/device_server.sh
start_server "$out/grpc" random:1.7b-custom_voice "$port" --max-calls-per-caller 100000
loadgen=(python3 -m clients.loadgen --server "127.0.0.1:$port" --rpc online --seed 1)
# A warm-up, so that neither side pays for first calls (the engine benchmark warms up on its own).
"${loadgen[@]}" --concurrency 8 --requests 32 --out "$out/grpc/warmup.json.gz" > /dev/null
for concurrency in ${levels//,/ }; do
  "${loadgen[@]}" --concurrency "$concurrency" --requests "$requests" --out "$out/grpc/loadgen-c$concurrency.json.gz" \
    | tee -a "$out/grpc/loadgen.txt"
done
stop_server
# SynthesizeOnline gives a CustomVoice model its whole text up front, as qwen-tts does: --non-streaming-text.
python3 -m benchmarks.engine --concurrency "$levels" --workload loadgen --seed 1 --requests-per-level "$requests" \
    --non-streaming-text --profile-steps --out "$out/engine-loadgen.json" > "$out/engine-loadgen.txt"
python3 -m benchmarks.ceiling --grpc "$out/grpc" --engine "$out/engine-loadgen.json" --out "$out/ceiling.json"
