# Session 20, call 4 (H100): call 3's tree with decode attention and qk_norm_rope launched early only at one and
# two rows: GPU-only A/B in one process against 36d0d5a's kernels (s20ab2.py; at 256 rows two runners, memory);
# the frame-step table.
W=/tmp/s20c4; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s20run4.sh $W/run.sh; cp .devwork/s20ab2.py $W/; tar czf $OUT/s20c4.tgz -C /tmp s20c4' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv; tail -1 $W/gpu.csv
show() { grep "^{" $1 | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r['size'], r['batch'], 'device', ' '.join('%s %.3f' % kv for kv in r['median_ms'].items()))
    print('   host-timed', ' '.join('%s %.3f' % kv for kv in r['host_timed_ms'].items()))
"; grep -i -B2 -A12 "Traceback" $1 | head -30; }
SECONDS=0
timeout 200 python3 .devwork/s20ab2.py $W/ab.json 1.7b,0.6b 1,2,64 > $W/ab.txt 2>&1; echo "ab rc=$? ${SECONDS}s"; show $W/ab.txt
SECONDS=0
timeout 120 python3 .devwork/s20ab2.py $W/ab256.json 1.7b,0.6b 256 new,attention_head > $W/ab256.txt 2>&1; echo "ab256 rc=$? ${SECONDS}s"; show $W/ab256.txt
SECONDS=0
timeout 110 python3 -m benchmarks.frame_step --sizes 1.7b,0.6b --batch-sizes 1,2,4,8,32,64,128,256 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$? ${SECONDS}s"; grep -v -i warn $W/frame_step.txt | tail -17
