# Session 14, call 2 (H100): SlotState.assign in two queued uploads (it wrote Python numbers into device tensors,
# each a blocking copy that waited for the talker pass), on top of call 1's fix. The sync probe over the engine;
# runner and engine GPU tests; the engine at 128 with 512 requests on the fix and on 1b966f9 (.devwork/prev); the
# default run on the fix.
W=/tmp/s14c2; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s14run2.sh .devwork/sync_probe.py $W/; tar czf $OUT/s14c2.tgz -C /tmp s14c2' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 60 python3 .devwork/sync_probe.py > $W/sync_probe.txt 2>&1; echo "probe rc=$? ${SECONDS}s"; grep -v -i "warn" $W/sync_probe.txt | tail -12 | cut -c1-400
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 150 python3 -m pytest -q tests/gpu/test_runner_cuda.py tests/gpu/test_engine_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E |runner.py:[0-9]+: in|frame_step.py:[0-9]+: in" $W/gpu_tests.txt | head -8 | cut -c1-300
bench() { (cd $1 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 80 python3 -m benchmarks.engine --profile-steps --out $W/engine-$2.json "${@:3}" > $W/engine-$2.txt 2>&1; echo "engine $2 rc=$? ${SECONDS}s"; grep -v -i warn $W/engine-$2.txt | grep -A9 "conc ")
}
bench . new-512 --concurrency 128 --requests-per-level 512
bench .devwork/prev prev-512 --concurrency 128 --requests-per-level 512
bench . new --concurrency 1,32,128
