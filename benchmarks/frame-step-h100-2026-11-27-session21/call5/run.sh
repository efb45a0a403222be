# Session 21, call 5 (H100): the whole GPU suite on the tree of call 4; the codebook-0 kernel's warps (s21cb0.py);
# the frame-step table.
W=/tmp/s21c5; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s21run5.sh $W/run.sh; cp .devwork/s21cb0.py $W/; tar czf $OUT/s21c5.tgz -C /tmp s21c5' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv; tail -1 $W/gpu.csv
SECONDS=0
timeout 60 python3 .devwork/s21cb0.py $W/cb0.json > $W/cb0.txt 2>&1; echo "cb0 rc=$? ${SECONDS}s"; grep "^{" $W/cb0.txt; grep -A12 Traceback $W/cb0.txt | head -20
SECONDS=0
timeout 280 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head
SECONDS=0
timeout 130 python3 -m benchmarks.frame_step --sizes 1.7b,0.6b --batch-sizes 1,2,4,8,32,64,128,256 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$? ${SECONDS}s"; grep -v -i warn $W/frame_step.txt | tail -17
