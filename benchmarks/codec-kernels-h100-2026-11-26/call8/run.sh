# Session 15, call 8 (H100): the working tree, steps scheduled ahead (EngineConfig.schedule_ahead, on by default).
# The whole GPU suite; the frame graph alone at 96 and 128 rows; the engine at 128 streams, 512 requests, ahead on
# and off alternated twice; the default run (1, 32, 128 streams) with it on.
W=/tmp/s15c8; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s15run8.sh $W/run.sh; tar czf $OUT/s15c8.tgz -C /tmp s15c8' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 300 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -6 | cut -c1-300
timeout 90 python3 -m benchmarks.frame_step --sizes 1.7b --batch-sizes 96,128 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame step rc=$? ${SECONDS}s"; tail -2 $W/frame_step.txt
bench() { timeout 90 python3 -m benchmarks.engine --profile-steps --out $W/engine-$1.json "${@:2}" > $W/engine-$1.txt 2>&1; echo "engine $1 rc=$? ${SECONDS}s"; grep -v -i warn $W/engine-$1.txt | grep -A9 "conc " | grep -v "first audio" | tail -2 | cut -c1-330
}
for run in a b; do
bench ahead-512-$run --concurrency 128 --requests-per-level 512
bench inorder-512-$run --concurrency 128 --requests-per-level 512 --schedule-ahead off
done
bench ahead-default --concurrency 1,32,128
