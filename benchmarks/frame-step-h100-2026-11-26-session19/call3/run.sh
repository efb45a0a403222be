# Session 19, call 3 (H100): the frame step at 1, 2 and 64 rows, this tree (row projections with the call-2 tilings;
# q/k norm and RoPE inside the decode attention kernel) against 58d004e (.devwork/prev), twice each, alternating;
# the profile of one row; where the sampling kernel's time goes; the row-projection sweep at two rows; GPU suite.
W=/tmp/s19c3; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s19run3.sh $W/run.sh; cp .devwork/s19probe.py .devwork/s19samp.py $W/; tar czf $OUT/s19c3.tgz -C /tmp s19c3' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
for tree in new-a prev-a new-b prev-b; do
  case $tree in prev*) D=$PWD/.devwork/prev;; *) D=$PWD;; esac
  SECONDS=0
  (cd $D && PYTHONPATH=$D:$D/proto:/tmp/site timeout 110 python3 -m benchmarks.frame_step --sizes 1.7b,0.6b --batch-sizes 1,2,64 --out $W/frame_step-$tree.json > $W/frame_step-$tree.txt 2>&1; echo "frame $tree rc=$? ${SECONDS}s")
  grep -v -i warn $W/frame_step-$tree.txt | tail -7
done
SECONDS=0
timeout 60 python3 -m benchmarks.profile_step --batch 1 --out $W/profile-new.json > $W/profile-new.txt 2>&1; echo "profile rc=$? ${SECONDS}s"; grep -v -i warn $W/profile-new.txt | head -24
SECONDS=0
timeout 60 python3 .devwork/s19samp.py $W/samp.json > $W/samp.txt 2>&1; echo "samp rc=$? ${SECONDS}s"; cat $W/samp.txt | cut -c1-600
SECONDS=0
timeout 80 python3 .devwork/s19probe.py $W/probe-b2.json rows,b2 > $W/probe-b2.txt 2>&1; echo "probe rc=$? ${SECONDS}s"
python3 - $W/probe-b2.json <<'PY'
import json, sys
for x in json.load(open(sys.argv[1]))["results"]:
    print(x['size'], x['batch'], x['kind'], 'chain %.2f/%.2f' % (x['chain_us'], x['chain_again_us']), 'err %.2e/%.2e' % (x['best']['err'], x['chain_err']), ' '.join('%s:%.1f' % ('/'.join(map(str,t['tiling'])), t.get('us', -1)) for t in x['tilings']))
PY
SECONDS=0
timeout 170 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -8 | cut -c1-300
