#!/usr/bin/env bash
# What metrics and tracing cost the engine's frame step, on a GPU machine with no network:
#     bash benchmarks/device_observability.sh OUT_DIR [CONCURRENCY] [ROUNDS]
# Wheels the machine lacks travel in .whl/ (fetched here by benchmarks/fetch_wheels.sh): .whl/site (audio libraries), .whl/grpc (gRPC extras and
# protobuf) and .whl/otel (the OpenTelemetry SDK and its OTLP/gRPC exporter).
set -euo pipefail
out=${1:?usage: device_observability.sh OUT_DIR [CONCURRENCY] [ROUNDS]}
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
install /tmp/site .whl/site/*.whl .whl/grpc/*.whl .whl/otel/*.whl
export PYTHONPATH="$PWD:$PWD/proto:/tmp/site" PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.csv"
python3 -m benchmarks.observability --model random:1.7b-custom_voice --concurrency "${2:-1,64}" \
    --rounds "${3:-3}" --out "$out/observability.json" | tee "$out/observability.txt"
