# Session 13, call 5 (H100): HEAD (the frame step decodes the newest frames' audio on the device right behind them)
# against d8b9cd0 (.devwork/mid: the codec on its own stream, the decodes before the prefills). Runner and engine GPU
# tests; the engine in process at 1, 32, 128 (HEAD); at 128 with 512 requests (both trees); the frame step at 128.
W=/tmp/s13c5; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s13run5.sh $W/run.sh; tar czf $OUT/s13c5.tgz -C /tmp s13c5' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 130 python3 -m pytest -q tests/gpu/test_runner_cuda.py tests/gpu/test_engine_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -5 | cut -c1-300
bench() { (cd $1 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 80 python3 -m benchmarks.engine --profile-steps --out $W/engine-$2.json "${@:3}" > $W/engine-$2.txt 2>&1; echo "engine $2 rc=$? ${SECONDS}s"; grep -v -i warn $W/engine-$2.txt | grep -A9 "conc ")
}
bench . new --concurrency 1,32,128
bench . new-512 --concurrency 128 --requests-per-level 512
bench .devwork/mid mid-512 --concurrency 128 --requests-per-level 512
(PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 40 python3 -m benchmarks.frame_step --sizes 1.7b --batch-sizes 128 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$? ${SECONDS}s"; grep -v -i warn $W/frame_step.txt | tail -1)
