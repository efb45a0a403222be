#!/usr/bin/env bash
# gRPC load of several commits side by side on one GPU machine: each tree's server on random 1.7B CustomVoice
# weights, one after the other, driven by this tree's load generator (one definition of underruns for all),
# open-loop Poisson, mixed calls, 30 s a rate. Each summary lands in $OUT/LABEL/summary.json, keyed by rate (a
# rate's second run as RATE-2, and so on). A rate written with a w (20w) has every request ask for word timestamps;
# a spec may end in server flags for its tree (":--aligner-model random:0.6b"). Alternating loads of each kind on
# every server, e.g. "head=.:20,20w,20,20w:--aligner-model random:0.6b", compare what timestamps cost.
#     bash benchmarks/device_load_side_by_side.sh LABEL=TREE:RATES[:SERVER_FLAGS] [LABEL=TREE:RATES ...]
# Make each tree here, where git is, and carry it (with .whl) to the GPU machine, e.g.:
#     mkdir -p .devwork/old && git archive a48a27f | tar -x -C .devwork/old
set -u
source benchmarks/device_server.sh  # installs the carried wheels into /tmp/site
head=$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.csv"
for spec in "$@"; do
  label=${spec%%=*}; rest=${spec#*=}; tree=$(cd "${rest%%:*}" && pwd); rest=${rest#*:}
  rates=${rest%%:*}; flags=""; [[ $rest == *:* ]] && flags=${rest#*:}
  out=$OUT/$label; mkdir -p "$out"
  (cd "$tree" && PYTHONPATH="$tree:$tree/proto:/tmp/site" exec python3 -m tts_service --model random:1.7b-custom_voice \
      --port 50151 --host 127.0.0.1 --max-calls-per-caller 100000 $flags > "$out/server.log" 2>&1) &
  pid=$!
  started=$(date +%s)
  python3 - <<'PY'
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
stub = health_pb2_grpc.HealthStub(grpc.insecure_channel("127.0.0.1:50151"))
for reply in stub.Watch(health_pb2.HealthCheckRequest(), timeout=300, wait_for_ready=True):
    if reply.status == health_pb2.HealthCheckResponse.SERVING:
        break
PY
  echo "$label: serving after $(( $(date +%s) - started )) s"
  declare -A runs=()
  for rate in ${rates//,/ }; do
    runs[$rate]=$(( ${runs[$rate]:-0} + 1 ))
    name=$rate; (( ${runs[$rate]} > 1 )) && name=$rate-${runs[$rate]}
    words=""; [[ $rate == *w ]] && words=--word-timestamps
    python3 -m clients.loadgen --server 127.0.0.1:50151 --rate "${rate%w}" --duration 30 --rpc mixed --seed 1 $words \
        --out "$out/lg-$name.json.gz" | tee -a "$out/loadgen.txt"
  done
  unset runs
  kill -TERM $pid; wait $pid; echo "$label server exit $?"
  python3 -m benchmarks.loadgen_summaries "$out"
  server_log_faults "$out/server.log"
  grep -m1 "forced aligner" "$out/server.log" | cut -c1-300; rm -f "$out/server.log"
done
