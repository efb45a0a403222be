#!/usr/bin/env bash
# Time to first audio of an in-context clone by registered voice id against the same clone sent with its audio,
# through the real gRPC server on random 1.7B Base weights, on a GPU machine with no network:
#     bash benchmarks/device_voice_ttfa.sh OUT_DIR [ITERATIONS]
# Wheels as benchmarks/device_server.sh says (carry .whl after benchmarks/fetch_wheels.sh site grpc otel).
set -euo pipefail
out=${1:?usage: device_voice_ttfa.sh OUT_DIR [ITERATIONS]}
port=50152
# shellcheck source=benchmarks/device_server.sh
source benchmarks/device_server.sh
start_server "$out" random:1.7b-base "$port"
python3 -m benchmarks.voice_ttfa --server "127.0.0.1:$port" --iterations "${2:-30}" --out "$out/voice_ttfa.json" \
    | tee "$out/voice_ttfa.txt"
