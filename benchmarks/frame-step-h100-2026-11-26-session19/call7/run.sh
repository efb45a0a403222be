# Session 19, call 7 (H100): the predictor pass embedding the previous codes itself, its counter left at zero by its
# last program, the pass and the sampling kernel launched as programmatic dependents: the GPU suite; GPU-only A/B
# in one process (pass/sampling PDL on/off, no PDL, none of the session's launch changes); the same probe on
# 2afdce3 (.devwork/prev, embeddings outside the pass); profile of one row.
W=/tmp/s19c7; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s19run7.sh $W/run.sh; cp .devwork/s19ab3.py .devwork/s19ab4.py $W/; tar czf $OUT/s19c7.tgz -C /tmp s19c7' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 170 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -8 | cut -c1-300
show() { grep "^{" $1 | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r['size'], r['batch'], 'device', ' '.join('%s %.3f' % kv for kv in r['median_ms'].items()), '| host-timed', ' '.join('%s %.3f' % kv for kv in r['host_timed_ms'].items()))
    print('   rounds', {k: [round(x, 3) for x in v] for k, v in r['device_ms'].items()})
"; grep -i -B2 -A12 "Traceback" $1 | head -30; }
SECONDS=0
timeout 150 python3 .devwork/s19ab4.py $W/ab-new.json 1.7b,0.6b 1,2,64 > $W/ab-new.txt 2>&1; echo "ab new rc=$? ${SECONDS}s"; show $W/ab-new.txt
SECONDS=0
(cd .devwork/prev && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 150 python3 ../s19ab3.py $W/ab-prev.json 1.7b,0.6b 1,2,64 > $W/ab-prev.txt 2>&1; echo "ab prev rc=$? ${SECONDS}s"); show $W/ab-prev.txt
SECONDS=0
timeout 60 python3 -m benchmarks.profile_step --batch 1,64 --out $W/profile.json > $W/profile.txt 2>&1; echo "profile rc=$? ${SECONDS}s"; grep -v -i warn $W/profile.txt | head -12
