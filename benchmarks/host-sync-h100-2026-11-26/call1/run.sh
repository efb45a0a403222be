# Session 14, call 1 (H100): the fix (reset_audio and the codec's eager path upload slots without a blocking copy,
# which synchronized the codec stream) against 1b966f9 (.devwork/prev, with the new test file). Runner and engine
# GPU tests on the fix; the new sync test on the old tree (expected to fail); the engine at 128 with 512 requests
# on both trees; the default run on the fix; the frame step at 96 and 128.
W=/tmp/s14c1; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s14run1.sh $W/run.sh; tar czf $OUT/s14c1.tgz -C /tmp s14c1' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 150 python3 -m pytest -q tests/gpu/test_runner_cuda.py tests/gpu/test_engine_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -5 | cut -c1-300
(cd .devwork/prev && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 60 python3 -m pytest -q tests/gpu/test_runner_cuda.py -k never_waits -p no:cacheprovider > $W/prev_sync_test.txt 2>&1; echo "prev sync test rc=$? ${SECONDS}s"; tail -1 $W/prev_sync_test.txt; grep -E "^E " $W/prev_sync_test.txt | head -4 | cut -c1-300; grep -B2 -A2 "synchroniz" $W/prev_sync_test.txt | grep "runner.py" | head -4)
bench() { (cd $1 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 80 python3 -m benchmarks.engine --profile-steps --out $W/engine-$2.json "${@:3}" > $W/engine-$2.txt 2>&1; echo "engine $2 rc=$? ${SECONDS}s"; grep -v -i warn $W/engine-$2.txt | grep -A9 "conc ")
}
bench . new-512 --concurrency 128 --requests-per-level 512
bench .devwork/prev prev-512 --concurrency 128 --requests-per-level 512
bench . new --concurrency 1,32,128
(PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 50 python3 -m benchmarks.frame_step --sizes 1.7b --batch-sizes 96,128 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$? ${SECONDS}s"; grep -v -i warn $W/frame_step.txt | tail -2)
