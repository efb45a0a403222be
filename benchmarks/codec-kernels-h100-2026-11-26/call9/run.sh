# Session 15, call 9 (H100): HEAD 586a718 (steps scheduled ahead from 64 decodes a step). GPU tests of the engine
# and runner; the engine at 128 streams, 512 requests, the default threshold (64) against never ahead, alternated
# twice; the default run (1, 32, 128 streams).
W=/tmp/s15c9; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s15run9.sh $W/run.sh; tar czf $OUT/s15c9.tgz -C /tmp s15c9' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 200 python3 -m pytest -q tests/gpu/test_engine_cuda.py tests/gpu/test_runner_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -6 | cut -c1-300
timeout 90 python3 -m benchmarks.frame_step --sizes 1.7b --batch-sizes 96,128 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame step rc=$? ${SECONDS}s"; tail -2 $W/frame_step.txt
bench() { timeout 90 python3 -m benchmarks.engine --profile-steps --out $W/engine-$1.json "${@:2}" > $W/engine-$1.txt 2>&1; echo "engine $1 rc=$? ${SECONDS}s"; grep -v -i warn $W/engine-$1.txt | grep -A12 "conc " | grep -v "phases" | cut -c1-200
}
for run in a b; do
bench ahead-512-$run --concurrency 128 --requests-per-level 512
bench inorder-512-$run --concurrency 128 --requests-per-level 512 --min-decodes-to-schedule-ahead off
done
bench default --concurrency 1,32,128
