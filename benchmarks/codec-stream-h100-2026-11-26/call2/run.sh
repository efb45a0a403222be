# Session 13, call 2 (H100): the codec on its own stream, and the decodes' talker pass queued before the prefills (HEAD) against bb415d3
# (.devwork/prev). GPU tests; the engine in process at 1, 32, 128 (both trees); the frame step at 128 rows.
W=/tmp/s13c2; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s13run2.sh $W/run.sh; tar czf $OUT/s13c2.tgz -C /tmp s13c2' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 170 python3 -m pytest -q tests/gpu/test_runner_cuda.py tests/gpu/test_engine_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -5 | cut -c1-300
SECONDS=0
timeout 130 python3 -m benchmarks.engine --concurrency 1,32,128 --profile-steps --out $W/engine-new.json > $W/engine-new.txt 2>&1; echo "engine new rc=$? ${SECONDS}s"; grep -v -i warn $W/engine-new.txt | grep -A9 "conc "
SECONDS=0
timeout 40 python3 -m benchmarks.frame_step --sizes 1.7b --batch-sizes 128 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$? ${SECONDS}s"; grep -v -i warn $W/frame_step.txt | tail -1
SECONDS=0
(cd .devwork/prev && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 130 python3 -m benchmarks.engine --concurrency 1,32,128 --profile-steps --out $W/engine-prev.json > $W/engine-prev.txt 2>&1; echo "engine prev rc=$? ${SECONDS}s"; grep -v -i warn $W/engine-prev.txt | grep -A9 "conc ")
