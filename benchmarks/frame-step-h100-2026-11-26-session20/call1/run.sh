# Session 20, call 1 (H100): grid-barrier forms alone (s20bar.py) and inside the predictor kernel (s20pass.py,
# codebooks 2-15 in graphs, bit-equality with the committed kernel); the frame-step table on the committed tree.
W=/tmp/s20c1; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s20run1.sh $W/run.sh; cp .devwork/s20bar.py .devwork/s20pass.py .devwork/s20samp.py $W/; tar czf $OUT/s20c1.tgz -C /tmp s20c1' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv; cat $W/gpu.csv | tail -1
SECONDS=0
timeout 60 python3 .devwork/s20bar.py $W/barriers.json > $W/barriers.txt 2>&1; echo "barriers rc=$? ${SECONDS}s"; cat $W/barriers.txt | cut -c1-300 | tail -8
SECONDS=0
timeout 170 python3 .devwork/s20pass.py $W/pass.json 1.7b,0.6b > $W/pass.txt 2>&1; echo "pass rc=$? ${SECONDS}s"; grep "^{" $W/pass.txt | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line); print(r['size'], r['batch'], r['equal_to_committed'], r['median_us_14_calls'])"; grep -i -B2 -A12 "Traceback" $W/pass.txt | head -30
SECONDS=0
timeout 90 python3 .devwork/s20samp.py $W/sampling.json > $W/sampling.txt 2>&1; echo "sampling rc=$? ${SECONDS}s"; cut -c1-220 $W/sampling.txt | grep -v "^ *$" | tail -14
SECONDS=0
timeout 150 python3 -m benchmarks.frame_step --sizes 1.7b,0.6b --batch-sizes 1,2,4,8,32,64,128,256 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$? ${SECONDS}s"; grep -v -i warn $W/frame_step.txt | tail -17
