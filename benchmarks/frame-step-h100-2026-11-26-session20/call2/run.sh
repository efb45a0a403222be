# Session 20, call 2 (H100): the tree (one-thread barrier in the predictor kernel, two-bit select + greedy branch
# in the sampling kernel): the GPU tests of what changed; GPU-only A/B of the frame step in one process against
# HEAD's kernels (s20ab.py); the frame-step table (both sizes, 1-256 rows); the fidelity suite step.
W=/tmp/s20c2; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s20run2.sh $W/run.sh; cp .devwork/s20ab.py $W/; tar czf $OUT/s20c2.tgz -C /tmp s20c2' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
[ -d /tmp/refsite ] || install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv; tail -1 $W/gpu.csv
SECONDS=0
timeout 90 python3 -m pytest -q tests/gpu/test_predictor_pass_cuda.py tests/gpu/test_sampling_cuda.py tests/gpu/test_frame_step_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^E " $W/gpu_tests.txt | head -8 | cut -c1-300
SECONDS=0
timeout 150 python3 .devwork/s20ab.py $W/ab.json 1.7b,0.6b 1,2,64 > $W/ab.txt 2>&1; echo "ab rc=$? ${SECONDS}s"; grep "^{" $W/ab.txt | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r['size'], r['batch'], 'device', ' '.join('%s %.3f' % kv for kv in r['median_ms'].items()), '| host-timed', ' '.join('%s %.3f' % kv for kv in r['host_timed_ms'].items()))
"; grep -i -B2 -A12 "Traceback" $W/ab.txt | head -30
SECONDS=0
timeout 140 python3 -m benchmarks.frame_step --sizes 1.7b,0.6b --batch-sizes 1,2,4,8,32,64,128,256 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$? ${SECONDS}s"; grep -v -i warn $W/frame_step.txt | tail -17
SECONDS=0; mkdir -p $W/suite
timeout 110 python3 -m benchmarks.suite --out $W/suite --reference-site /tmp/refsite --skip frame_step,engine,reference > $W/suite.txt 2>&1; echo "suite rc=$? ${SECONDS}s"; grep -A9 "^system" $W/suite.txt | tail -9
