# Session 14, call 6 (H100): HEAD. The GPU tests (runner and engine, with the engine's sync test); each stream's
# idle time per step at 128 streams, 512 requests (benchmarks.stream_idle).
W=/tmp/s14c6; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s14run6.sh $W/run.sh; tar czf $OUT/s14c6.tgz -C /tmp s14c6' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 200 python3 -m pytest -q tests/gpu/test_runner_cuda.py tests/gpu/test_engine_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E |runner.py:[0-9]+: in" $W/gpu_tests.txt | head -8 | cut -c1-300
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 150 python3 -m benchmarks.stream_idle --out $W/stream_idle.json > $W/stream_idle.txt 2>&1; echo "idle rc=$? ${SECONDS}s"; grep -v -i warn $W/stream_idle.txt | tail -8
