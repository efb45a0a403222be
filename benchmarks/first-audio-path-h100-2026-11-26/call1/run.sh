# Session 16, call 1 (H100): the decode rows, positions and block tables in one pinned upload (working tree) against
# HEAD 3ed288f (.devwork/prev): GPU tests of the runner and engine; the engine in process at 1, 16, 32 and 128 streams,
# each tree; then where a gRPC call's first audio spends its time outside the engine core (.devwork/s16lat.py),
# at 1 and 20 req/s, on the working tree.
W=/tmp/s16c1; rm -rf $W; mkdir -p $W/lat
trap 'cp .devwork/s16run1.sh .devwork/s16lat.py $W/; gzip -f $W/lat/server.log; tar czf $OUT/s16c1.tgz -C /tmp s16c1' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
install /tmp/site .whl/site/*.whl .whl/grpc/*.whl .whl/otel/*.whl
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 200 python3 -m pytest -q tests/gpu/test_engine_cuda.py tests/gpu/test_runner_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -6 | cut -c1-300
bench() { local tree=$1 name=$2; shift 2; (cd $tree && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 100 python3 -m benchmarks.engine --profile-steps --out $W/engine-$name.json "$@" > $W/engine-$name.txt 2>&1); echo "engine $name rc=$? ${SECONDS}s"; grep -v -i warn $W/engine-$name.txt | grep -A12 "conc " | cut -c1-420
}
bench .devwork/prev prev --concurrency 1,16,32,128
bench . new --concurrency 1,16,32,128
export PYTHONPATH=$PWD:$PWD/proto:/tmp/site
python3 .devwork/s16lat.py server $W/lat/server_times.json --model random:1.7b-custom_voice --port 50151 --host 127.0.0.1 --metrics-port 9464 --max-calls-per-caller 100000 > $W/lat/server.log 2>&1 &
server=$!
python3 - <<'PY'
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
stub = health_pb2_grpc.HealthStub(grpc.insecure_channel("127.0.0.1:50151"))
for reply in stub.Watch(health_pb2.HealthCheckRequest(), timeout=240, wait_for_ready=True):
    if reply.status == health_pb2.HealthCheckResponse.SERVING:
        break
PY
echo "server up ${SECONDS}s"
for rate in 1 20; do
  timeout 60 python3 .devwork/s16lat.py client $W/lat/client-${rate}.json --server 127.0.0.1:50151 --rate $rate --duration 25 --rpc mixed --seed 1 --out $W/lat/loadgen-${rate}rps.json.gz | tail -1
done
kill -TERM $server; wait $server
echo "server done ${SECONDS}s"
python3 .devwork/s16lat.py report $W/lat/report.json $W/lat/server_times.json $W/lat/client-1.json $W/lat/client-20.json
