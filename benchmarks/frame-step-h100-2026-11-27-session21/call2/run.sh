# Session 21, call 2 (H100): codebook 1 in the predictor kernel, the sampling kernel copying the next input's
# embedding. GPU-only A/B (s21ab.py: head / cb1 / new) at 1 and 2 rows, both sizes; the changed GPU test files;
# the fidelity step; the frame-step table; the rest of the GPU suite if time is left.
W=/tmp/s21c2; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s21run2.sh $W/run.sh; cp .devwork/s21ab.py $W/; tar czf $OUT/s21c2.tgz -C /tmp s21c2' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
[ -d /tmp/refsite ] || install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv; tail -1 $W/gpu.csv
SECONDS=0
timeout 170 python3 .devwork/s21ab.py $W/ab.json 0.6b,1.7b 1,2 > $W/ab.txt 2>&1; echo "ab rc=$? ${SECONDS}s"; grep "^{" $W/ab.txt | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r['size'], r['batch'], 'device', ' '.join('%s %.3f' % kv for kv in r['median_ms'].items()))
"; grep -i -B2 -A12 "Traceback" $W/ab.txt | head -30
SECONDS=0
timeout 100 python3 -m pytest -q tests/gpu/test_predictor_pass_cuda.py tests/gpu/test_sampling_cuda.py tests/gpu/test_frame_step_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)|Error" $W/gpu_tests.txt | head
SECONDS=0; mkdir -p $W/suite
timeout 120 python3 -m benchmarks.suite --out $W/suite --reference-site /tmp/refsite --skip frame_step,engine,reference > $W/suite.txt 2>&1; echo "suite rc=$? ${SECONDS}s"; grep -A9 "^system" $W/suite.txt | tail -9
SECONDS=0
timeout 130 python3 -m benchmarks.frame_step --sizes 1.7b,0.6b --batch-sizes 1,2,4,8,32,64,128,256 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$? ${SECONDS}s"; grep -v -i warn $W/frame_step.txt | tail -17
