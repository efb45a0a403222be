# Session 13, call 3 (H100): HEAD (frames on a high-priority stream, codec on its own) against c0fbc41 (.devwork/mid:
# codec stream, decodes queued first, no priority) and bb415d3 (.devwork/prev). GPU tests; the engine in process at
# 1, 32, 128 (the three trees); the frame step at 128 rows.
W=/tmp/s13c3; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s13run3.sh $W/run.sh; tar czf $OUT/s13c3.tgz -C /tmp s13c3' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 170 python3 -m pytest -q tests/gpu/test_runner_cuda.py tests/gpu/test_engine_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -5 | cut -c1-300
bench() { (cd $1 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 130 python3 -m benchmarks.engine --concurrency 1,32,128 --profile-steps --out $W/engine-$2.json > $W/engine-$2.txt 2>&1; echo "engine $2 rc=$?"; grep -v -i warn $W/engine-$2.txt | grep -A9 "conc " | grep -v "^ *1 \|first audio")
}
bench . new
bench .devwork/mid mid
bench .devwork/prev prev
timeout 40 python3 -m benchmarks.frame_step --sizes 1.7b --batch-sizes 128 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$?"; grep -v -i warn $W/frame_step.txt | tail -1
bench . new2
