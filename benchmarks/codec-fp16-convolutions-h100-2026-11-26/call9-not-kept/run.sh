# Session 12, call 9 (H100): the upsampling's bias folded into the first residual unit (HEAD) against 33c33a8
# (.devwork/prev). The fused-op and runner GPU tests; the engine in process at 128 (both trees); the frame step at 128.
W=/tmp/s12c9; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s12run9.sh $W/run.sh; tar czf $OUT/s12c9.tgz -C /tmp s12c9' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 70 python3 -m pytest -q tests/gpu/test_fused_ops_cuda.py tests/gpu/test_runner_cuda.py tests/gpu/test_engine_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -5 | cut -c1-300
timeout 60 python3 -m benchmarks.engine --concurrency 128 --profile-steps --out $W/engine-new.json > $W/engine-new.txt 2>&1; echo "engine new rc=$?"; grep -A1 "conc " $W/engine-new.txt
timeout 40 python3 -m benchmarks.frame_step --sizes 1.7b --batch-sizes 128 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$?"; grep -v -i warn $W/frame_step.txt | tail -1
(cd .devwork/prev && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 60 python3 -m benchmarks.engine --concurrency 128 --profile-steps --out $W/engine-prev.json > $W/engine-prev.txt 2>&1; echo "engine prev rc=$?"; grep -A1 "conc " $W/engine-prev.txt)
