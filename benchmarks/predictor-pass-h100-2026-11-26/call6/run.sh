# Session 17, call 6 (H100): the GPU suite with the one-kernel predictor call; the fidelity suite step (now with
# the batch-1 one-call path); the batch-1 profile.
W=/tmp/s17c6; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s17run6.sh $W/run.sh; tar czf $OUT/s17c6.tgz -C /tmp s17c6' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
[ -d /tmp/refsite ] || install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 240 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -6 | cut -c1-300
SECONDS=0; mkdir -p $W/suite
timeout 200 python3 -m benchmarks.suite --out $W/suite --reference-site /tmp/refsite --skip frame_step,engine,reference > $W/suite.txt 2>&1; echo "suite rc=$? ${SECONDS}s"; grep -A14 "^system" $W/suite.txt; tail -3 $W/suite.txt
SECONDS=0
timeout 90 python3 -m benchmarks.profile_step --batch 1 --out $W/profile.json > $W/profile.txt 2>&1; echo "profile rc=$? ${SECONDS}s"; grep -v -i warn $W/profile.txt | head -16 | cut -c1-150
