# Session 19, call 5 (H100): in one process per size, four runners (the packed frame table, and the attention's
# splits combined by their last program, each on or off) timed interleaved at 1, 2 and 64 rows; the profile of one
# row; the GPU test files of the kernels touched; the whole GPU suite if time allows.
W=/tmp/s19c5; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s19run5.sh $W/run.sh; cp .devwork/s19ab2.py $W/; tar czf $OUT/s19c5.tgz -C /tmp s19c5' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 100 python3 -m pytest -q -x tests/gpu/test_kv_cache_cuda.py tests/gpu/test_frame_step_cuda.py -p no:cacheprovider > $W/gpu_tests_kv.txt 2>&1; echo "kv gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests_kv.txt; grep -E "^E " $W/gpu_tests_kv.txt | head -8 | cut -c1-300
SECONDS=0
timeout 200 python3 .devwork/s19ab2.py $W/ab.json 1.7b,0.6b 1,2,64 > $W/ab.txt 2>&1; echo "ab rc=$? ${SECONDS}s"
grep "^{" $W/ab.txt | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if 'median_ms' in r: print(r['size'], r['batch'], ' '.join('%s %.3f' % kv for kv in r['median_ms'].items()), '| rounds', {k: [round(x, 3) for x in v] for k, v in r['step_ms'].items()})
"
grep -i -B2 -A12 "Traceback" $W/ab.txt | head -30
SECONDS=0
timeout 60 python3 -m benchmarks.profile_step --batch 1,2 --out $W/profile.json > $W/profile.txt 2>&1; echo "profile rc=$? ${SECONDS}s"; grep -v -i warn $W/profile.txt | head -14
SECONDS=0
timeout 200 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -8 | cut -c1-300
