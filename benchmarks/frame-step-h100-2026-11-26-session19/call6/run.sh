# Session 19, call 6 (H100): the row projections launched as programmatic dependents (PDL); GPU-only A/B of the
# frame graphs (PDL, packed frame table + in-kernel combine, each on/off) at 1, 2 and 64 rows, both sizes; the row
# projection and frame-step GPU tests under PDL; the profile of one row.
W=/tmp/s19c6; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s19run6.sh $W/run.sh; cp .devwork/s19ab3.py $W/; tar czf $OUT/s19c6.tgz -C /tmp s19c6' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 100 python3 -m pytest -q -x tests/gpu/test_row_projections_cuda.py tests/gpu/test_frame_step_cuda.py tests/gpu/test_runner_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^E " $W/gpu_tests.txt | head -8 | cut -c1-300
SECONDS=0
timeout 240 python3 .devwork/s19ab3.py $W/ab.json 1.7b,0.6b 1,2,64 > $W/ab.txt 2>&1; echo "ab rc=$? ${SECONDS}s"
grep "^{" $W/ab.txt | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r['size'], r['batch'], 'device', ' '.join('%s %.3f' % kv for kv in r['median_ms'].items()), '| host-timed', ' '.join('%s %.3f' % kv for kv in r['host_timed_ms'].items()))
    print('   rounds', {k: [round(x, 3) for x in v] for k, v in r['device_ms'].items()})
"
grep -i -B2 -A12 "Traceback" $W/ab.txt | head -30
SECONDS=0
timeout 60 python3 -m benchmarks.profile_step --batch 1 --out $W/profile.json > $W/profile.txt 2>&1; echo "profile rc=$? ${SECONDS}s"; grep -v -i warn $W/profile.txt | head -8
