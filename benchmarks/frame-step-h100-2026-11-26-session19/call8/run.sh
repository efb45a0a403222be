# Session 19, call 8 (H100): the predictor pass reading the previous codes by a scalar load (in place of call 7's
# per-row offsets), PDL on the pass and the sampling kernel: GPU tests of what changed; GPU-only A/B against
# 2afdce3 (.devwork/prev); the frame-step table (both sizes, 1-256 rows) and the fidelity suite step on this tree;
# the frame-step table on 2afdce3 if time is left.
W=/tmp/s19c8; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s19run8.sh $W/run.sh; cp .devwork/s19ab3.py .devwork/s19ab4.py $W/; tar czf $OUT/s19c8.tgz -C /tmp s19c8' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
[ -d /tmp/refsite ] || install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 80 python3 -m pytest -q tests/gpu/test_predictor_pass_cuda.py tests/gpu/test_sampling_cuda.py tests/gpu/test_frame_step_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^E " $W/gpu_tests.txt | head -8 | cut -c1-300
show() { grep "^{" $1 | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r['size'], r['batch'], 'device', ' '.join('%s %.3f' % kv for kv in r['median_ms'].items()))
"; grep -i -B2 -A12 "Traceback" $1 | head -30; }
SECONDS=0
timeout 110 python3 .devwork/s19ab4.py $W/ab-new.json 1.7b,0.6b 1,2,64 > $W/ab-new.txt 2>&1; echo "ab new rc=$? ${SECONDS}s"; show $W/ab-new.txt
SECONDS=0
(cd .devwork/prev && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 110 python3 ../s19ab3.py $W/ab-prev.json 1.7b,0.6b 1,2,64 > $W/ab-prev.txt 2>&1; echo "ab prev rc=$? ${SECONDS}s"); show $W/ab-prev.txt
SECONDS=0
timeout 130 python3 -m benchmarks.frame_step --sizes 1.7b,0.6b --batch-sizes 1,2,4,8,32,64,128,256 --out $W/frame_step-new.json > $W/frame_step-new.txt 2>&1; echo "frame new rc=$? ${SECONDS}s"; grep -v -i warn $W/frame_step-new.txt | tail -17
SECONDS=0; mkdir -p $W/suite
timeout 100 python3 -m benchmarks.suite --out $W/suite --reference-site /tmp/refsite --skip frame_step,engine,reference > $W/suite.txt 2>&1; echo "suite rc=$? ${SECONDS}s"; grep -A9 "^system" $W/suite.txt | tail -9
SECONDS=0
(cd .devwork/prev && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 120 python3 -m benchmarks.frame_step --sizes 1.7b,0.6b --batch-sizes 1,2,4,8,32,64,128,256 --out $W/frame_step-prev.json > $W/frame_step-prev.txt 2>&1; echo "frame prev rc=$? ${SECONDS}s"); grep -v -i warn $W/frame_step-prev.txt | tail -17
