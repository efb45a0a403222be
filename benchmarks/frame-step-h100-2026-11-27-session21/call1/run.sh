# Session 21, call 1 (H100): 5ec4e75 against 36d0d5a's kernels at 2 and 256 rows (s20ab2.py, GPU-only A/B); the
# predictor's first call (codebook 1) through the layer chain against one pass call (s21cb1.py); the eager
# profile of one 0.6B frame at one row.
W=/tmp/s21c1; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s21run1.sh $W/run.sh; cp .devwork/s20ab2.py .devwork/s21cb1.py $W/; tar czf $OUT/s21c1.tgz -C /tmp s21c1' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv; tail -1 $W/gpu.csv
SECONDS=0
timeout 100 python3 .devwork/s21cb1.py $W/cb1.json 0.6b,1.7b > $W/cb1.txt 2>&1; echo "cb1 rc=$? ${SECONDS}s"; grep "^{" $W/cb1.txt; grep -i -A12 "Traceback" $W/cb1.txt | head -20
SECONDS=0
timeout 150 python3 .devwork/s20ab2.py $W/ab.json 1.7b,0.6b 2,256 new,head > $W/ab.txt 2>&1; echo "ab rc=$? ${SECONDS}s"; grep "^{" $W/ab.txt | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r['size'], r['batch'], 'device', ' '.join('%s %.3f' % kv for kv in r['median_ms'].items()))
"; grep -i -A12 "Traceback" $W/ab.txt | head -20
SECONDS=0
timeout 80 python3 -m benchmarks.profile_step --model random:0.6b-custom_voice --batch 1 --out $W/profile06.json > $W/profile06.txt 2>&1; echo "profile rc=$? ${SECONDS}s"; grep -v -i warn $W/profile06.txt | head -20
