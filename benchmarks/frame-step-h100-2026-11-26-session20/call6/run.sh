# Session 20, call 6 (H100): the committed tree (decode attention's loop as 36d0d5a's): GPU-only A/B against
# 36d0d5a's predictor kernel and decode attention (s20ab2.py) at 1, 2 and 256 rows; the frame-step table; the
# fidelity suite step; the decode-attention GPU tests if time is left.
W=/tmp/s20c6; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s20run6.sh $W/run.sh; cp .devwork/s20ab2.py $W/; tar czf $OUT/s20c6.tgz -C /tmp s20c6' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
[ -d /tmp/refsite ] || install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv; tail -1 $W/gpu.csv
SECONDS=0
timeout 140 python3 .devwork/s20ab2.py $W/ab.json 1.7b,0.6b 1,2,256 new,head > $W/ab.txt 2>&1; echo "ab rc=$? ${SECONDS}s"; grep "^{" $W/ab.txt | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r['size'], r['batch'], 'device', ' '.join('%s %.3f' % kv for kv in r['median_ms'].items()))
"; grep -i -B2 -A12 "Traceback" $W/ab.txt | head -30
SECONDS=0
timeout 125 python3 -m benchmarks.frame_step --sizes 1.7b,0.6b --batch-sizes 1,2,4,8,32,64,128,256 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$? ${SECONDS}s"; grep -v -i warn $W/frame_step.txt | tail -17
SECONDS=0; mkdir -p $W/suite
timeout 115 python3 -m benchmarks.suite --out $W/suite --reference-site /tmp/refsite --skip frame_step,engine,reference > $W/suite.txt 2>&1; echo "suite rc=$? ${SECONDS}s"; grep -A9 "^system" $W/suite.txt | tail -9
SECONDS=0
timeout 80 python3 -m pytest -q tests/gpu/test_kv_cache_cuda.py tests/gpu/test_fused_ops_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head
