# Session 14, call 4 (H100): HEAD (the runner queues the codec restarts after the frames) against d1169e2
# (.devwork/prev: call 2's tree, 62306b1's code). The whole GPU suite on HEAD; the engine at 128 with 512 requests,
# the two trees alternated twice; the default run on HEAD.
W=/tmp/s14c4; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s14run4.sh $W/run.sh; tar czf $OUT/s14c4.tgz -C /tmp s14c4' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 200 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E |runner.py:[0-9]+: in|frame_step.py:[0-9]+: in" $W/gpu_tests.txt | head -8 | cut -c1-300
bench() { (cd $1 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 80 python3 -m benchmarks.engine --profile-steps --out $W/engine-$2.json "${@:3}" > $W/engine-$2.txt 2>&1; echo "engine $2 rc=$? ${SECONDS}s"; grep -v -i warn $W/engine-$2.txt | grep -A9 "conc " | grep -v "first audio")
}
bench . new-512-a --concurrency 128 --requests-per-level 512
bench .devwork/prev prev-512-a --concurrency 128 --requests-per-level 512
bench . new-512-b --concurrency 128 --requests-per-level 512
bench .devwork/prev prev-512-b --concurrency 128 --requests-per-level 512
bench . new --concurrency 1,32,128
