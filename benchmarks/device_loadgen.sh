#!/usr/bin/env bash
# The service's benchmark of record on a GPU machine with no network: the real gRPC server on random
# 1.7B weights, driven by the open-loop load generator at several request rates.
#     bash benchmarks/device_loadgen.sh OUT_DIR [RATES] [SECONDS_PER_RATE] [SERVER_FLAG ...]
# (extra server flags, e.g. --profile-steps, are passed to the server as they are)
# Wheels the machine lacks travel in .whl/ (fetched here by benchmarks/fetch_wheels.sh): .whl/site (audio libraries), .whl/otel (OpenTelemetry) and
# .whl/grpc (grpcio-tools, health checking, reflection, status and the protobuf they were built against).
# The server runs as in production, with its metrics endpoint on; the last scrape is kept.
set -euo pipefail
out=${1:?usage: device_loadgen.sh OUT_DIR [RATES] [SECONDS_PER_RATE]}
rates=${2:-1,10,20,40}
seconds=${3:-30}
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
install /tmp/site .whl/site/*.whl .whl/grpc/*.whl .whl/otel/*.whl
export PYTHONPATH="$PWD:$PWD/proto:/tmp/site" PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.csv"
port=50151
# The load generator stands for many users from one address: the per-caller call limit is lifted for it.
python3 -m tts_service --model random:1.7b-custom_voice --port "$port" --host 127.0.0.1 --metrics-port 9464 \
    --max-calls-per-caller 100000 "${@:4}" \
    > "$out/server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
python3 - "$port" <<'PY'
import sys
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
# Watch streams every status change, so this waits for SERVING without polling.
stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}"))
for reply in stub.Watch(health_pb2.HealthCheckRequest(), timeout=240, wait_for_ready=True):
    if reply.status == health_pb2.HealthCheckResponse.SERVING:
        break
PY
for rate in ${rates//,/ }; do
  python3 -m clients.loadgen --server "127.0.0.1:$port" --rate "$rate" --duration "$seconds" --rpc mixed \
    --seed 1 --out "$out/loadgen-${rate}rps.json" | tee -a "$out/loadgen.txt"
done
python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9464/metrics").read().decode())' \
    > "$out/metrics.txt"
