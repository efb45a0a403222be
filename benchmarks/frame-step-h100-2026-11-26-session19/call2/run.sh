# Session 19, call 2 (H100): the frame step at 1 and 2 rows for this tree (row projections at one row, tilings from
# call 1) and HEAD 58d004e (.devwork/prev) on one machine; the row-projection sweep again with whole-width chunks
# (every weight load issued before the norm's pass); the GPU suite.
W=/tmp/s19c2; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s19run2.sh $W/run.sh; cp .devwork/s19probe.py $W/; tar czf $OUT/s19c2.tgz -C /tmp s19c2' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
for tree in new prev new2; do
  if [ $tree = prev ]; then D=$PWD/.devwork/prev; else D=$PWD; fi
  SECONDS=0
  (cd $D && PYTHONPATH=$D:$D/proto:/tmp/site timeout 100 python3 -m benchmarks.frame_step --sizes 1.7b,0.6b --batch-sizes 1,2 --out $W/frame_step-$tree.json > $W/frame_step-$tree.txt 2>&1; echo "frame $tree rc=$? ${SECONDS}s")
  grep -v -i warn $W/frame_step-$tree.txt | tail -5
done
SECONDS=0
timeout 170 python3 .devwork/s19probe.py $W/probe.json rows > $W/probe.txt 2>&1; echo "probe rc=$? ${SECONDS}s"
python3 - $W/probe.json <<'PY'
import json, sys
for x in json.load(open(sys.argv[1]))["results"]:
    print(x['size'], x['kind'], 'chain %.2f/%.2f' % (x['chain_us'], x['chain_again_us']), 'err %.2e/%.2e' % (x['best']['err'], x['chain_err']), ' '.join('%s:%.1f' % ('/'.join(map(str,t['tiling'])), t.get('us', -1)) for t in x['tilings']))
PY
grep -i -B2 -A12 "Traceback" $W/probe.txt | head -30
SECONDS=0
timeout 200 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -8 | cut -c1-300
