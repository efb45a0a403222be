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
port=50151
# The load generator stands for many users from one address: the per-caller call limit is lifted for it.
# shellcheck source=benchmarks/device_server.sh
source benchmarks/device_server.sh
start_server "$out" random:1.7b-custom_voice "$port" --metrics-port 9464 --max-calls-per-caller 100000 "${@:4}"
for rate in ${rates//,/ }; do
  python3 -m clients.loadgen --server "127.0.0.1:$port" --rate "$rate" --duration "$seconds" --rpc mixed \
    --seed 1 --out "$out/loadgen-${rate}rps.json.gz" | tee -a "$out/loadgen.txt"
done
python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9464/metrics").read().decode())' \
    > "$out/metrics.txt"
