#!/usr/bin/env bash
# The three engine benchmarks in one call on a GPU machine with no network:
#     bash benchmarks/device_suite.sh OUT_DIR
# Wheels the machine lacks travel in .whl/ (fetched here by benchmarks/fetch_wheels.sh): .whl/site (audio libraries the service imports) and
# .whl/ref (qwen-tts with the transformers it pins, used only by the reference benchmark).
set -euo pipefail
out=${1:?usage: device_suite.sh OUT_DIR}
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
install /tmp/site .whl/site/*.whl
install /tmp/refsite .whl/ref/*.whl
export PYTHONPATH="$PWD:$PWD/proto:/tmp/site" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.csv"
python3 -m benchmarks.suite --out "$out" --reference-site /tmp/refsite "${@:2}"
