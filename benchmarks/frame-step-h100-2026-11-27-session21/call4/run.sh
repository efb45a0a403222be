# Session 21, call 4 (H100): the talker's input in one kernel, RoPE rows from a table, the predictor's row settings
# laid out by the codebook-0 kernel. GPU-only A/B (s21ab4.py: head / sampler / new) at 1, 2 and 64 rows, both
# sizes; the changed GPU test files; the eager profile of a 0.6B frame at one row; the fidelity step.
W=/tmp/s21c4; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s21run4.sh $W/run.sh; cp .devwork/s21ab4.py $W/; tar czf $OUT/s21c4.tgz -C /tmp s21c4' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
[ -d /tmp/refsite ] || install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv; tail -1 $W/gpu.csv
SECONDS=0
timeout 100 python3 -m pytest -q tests/gpu/test_fused_ops_cuda.py tests/gpu/test_runner_cuda.py tests/gpu/test_sampling_cuda.py tests/gpu/test_frame_step_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -B5 -A25 "def test_frame_embedding" $W/gpu_tests.txt | grep -E "^E " | head -8
SECONDS=0
timeout 200 python3 .devwork/s21ab4.py $W/ab.json 0.6b,1.7b 1,2,64 > $W/ab.txt 2>&1; echo "ab rc=$? ${SECONDS}s"; grep "^{" $W/ab.txt | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r['size'], r['batch'], 'device', ' '.join('%s %.3f' % kv for kv in r['median_ms'].items()))
"; grep -i -B2 -A12 "Traceback" $W/ab.txt | head -30
SECONDS=0
timeout 60 python3 -m benchmarks.profile_step --model random:0.6b-custom_voice --batch 1 --out $W/profile06.json > $W/profile06.txt 2>&1; echo "profile rc=$? ${SECONDS}s"; grep -v -i warn $W/profile06.txt | head -32 | cut -c1-140
SECONDS=0; mkdir -p $W/suite
timeout 120 python3 -m benchmarks.suite --out $W/suite --reference-site /tmp/refsite --skip frame_step,engine,reference > $W/suite.txt 2>&1; echo "suite rc=$? ${SECONDS}s"; grep -A9 "^system" $W/suite.txt | tail -9; grep -B2 -A8 Traceback $W/suite.txt | tail -12
