#!/usr/bin/env bash
# What metrics and tracing cost the engine's frame step, on a GPU machine with no network:
#     bash benchmarks/device_observability.sh OUT_DIR [CONCURRENCY] [ROUNDS]
# Wheels as benchmarks/device_server.sh says (carry .whl after benchmarks/fetch_wheels.sh site grpc otel).
set -euo pipefail
out=${1:?usage: device_observability.sh OUT_DIR [CONCURRENCY] [ROUNDS]}
# shellcheck source=benchmarks/device_server.sh
source benchmarks/device_server.sh
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.csv"
python3 -m benchmarks.observability --model random:1.7b-custom_voice --concurrency "${2:-1,64}" \
    --rounds "${3:-3}" --out "$out/observability.json" | tee "$out/observability.txt"
