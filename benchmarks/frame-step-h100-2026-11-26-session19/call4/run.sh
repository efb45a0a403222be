# Session 19, call 4 (H100): in one process per size, four runners (row projections up to two rows with the two-row
# tilings, and the q/k norm inside the attention kernel, each on or off) timed interleaved at 1, 2 and 64 rows; the
# decode attention alone three ways; the changed GPU test files; the fidelity suite step.
W=/tmp/s19c4; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s19run4.sh $W/run.sh; cp .devwork/s19ab.py $W/; tar czf $OUT/s19c4.tgz -C /tmp s19c4' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
[ -d /tmp/refsite ] || install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 280 python3 .devwork/s19ab.py $W/ab.json 1.7b,0.6b 1,2,64 > $W/ab.txt 2>&1; echo "ab rc=$? ${SECONDS}s"
grep "^{" $W/ab.txt | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if 'median_ms' in r: print(r['size'], r['batch'], ' '.join('%s %.3f' % kv for kv in r['median_ms'].items()), '| rounds', {k: [round(x, 3) for x in v] for k, v in r['step_ms'].items()})
    else: print(r)
"
grep -i -B2 -A12 "Traceback" $W/ab.txt | head -30
SECONDS=0
timeout 120 python3 -m pytest -q tests/gpu/test_kv_cache_cuda.py tests/gpu/test_row_projections_cuda.py tests/gpu/test_frame_step_cuda.py tests/gpu/test_predictor_pass_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -8 | cut -c1-300
SECONDS=0; mkdir -p $W/suite
timeout 160 python3 -m benchmarks.suite --out $W/suite --reference-site /tmp/refsite --skip frame_step,engine,reference > $W/suite.txt 2>&1; echo "suite rc=$? ${SECONDS}s"; grep -A9 "^system" $W/suite.txt | tail -9
