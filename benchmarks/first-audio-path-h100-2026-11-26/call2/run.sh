# Session 16, call 2 (H100): an open request's text sent without waiting for the core to take the request (working
# tree) against HEAD 3ed288f (.devwork/prev): where each gRPC call's first audio spends its time outside the engine
# core (.devwork/s16lat.py), at 1 and 20 req/s, each tree's server in turn.
W=/tmp/s16c2; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s16run2.sh .devwork/s16lat.py $W/; gzip -f $W/*/server.log; tar czf $OUT/s16c2.tgz -C /tmp s16c2' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
install /tmp/site .whl/site/*.whl .whl/grpc/*.whl .whl/otel/*.whl
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
PROBE=$PWD/.devwork/s16lat.py
run_tree() {
  local tree=$1 name=$2 out=$W/$2; mkdir -p $out
  (cd $tree && export PYTHONPATH=$PWD:$PWD/proto:/tmp/site
   python3 $PROBE server $out/server_times.json --model random:1.7b-custom_voice --port 50151 --host 127.0.0.1 --max-calls-per-caller 100000 > $out/server.log 2>&1 &
   server=$!
   python3 - <<'PY'
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
stub = health_pb2_grpc.HealthStub(grpc.insecure_channel("127.0.0.1:50151"))
for reply in stub.Watch(health_pb2.HealthCheckRequest(), timeout=240, wait_for_ready=True):
    if reply.status == health_pb2.HealthCheckResponse.SERVING:
        break
PY
   echo "$name server up ${SECONDS}s"
   for rate in 1 20; do
     timeout 70 python3 $PROBE client $out/client-${rate}.json --server 127.0.0.1:50151 --rate $rate --duration $([ $rate = 1 ] && echo 20 || echo 40) --rpc mixed --seed 1 --out $out/loadgen-${rate}rps.json.gz | tail -1
   done
   kill -TERM $server; wait $server
   echo "$name server done ${SECONDS}s"
   python3 $PROBE report $out/report.json $out/server_times.json $out/client-1.json $out/client-20.json | grep -E "matched|core_ttfa|client_ttfa|outside|submit_to_core")
}
run_tree .devwork/prev prev
run_tree . new
