# Session 18, call 6 (H100): the predictor kernel with two chunks in flight a program outside gate/up, against
# e68a2c2 and dc4eea4 and the chain (phases stamped at one and two rows); then, on this tree, the GPU suite and the
# fidelity suite step.
W=/tmp/s18c6; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s18run6.sh $W/run.sh; cp .devwork/s18var.py $W/; tar czf $OUT/s18c6.tgz -C /tmp s18c6' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
[ -d /tmp/refsite ] || install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 200 python3 .devwork/s18var.py $W/variants.json > $W/variants.txt 2>&1; echo "variants rc=$? ${SECONDS}s"
grep "^{" $W/variants.txt | grep timing | cut -c1-400; grep -i -B2 -A8 "error\|Traceback" $W/variants.txt | head -30
SECONDS=0
timeout 220 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -6 | cut -c1-300
SECONDS=0; mkdir -p $W/suite
timeout 150 python3 -m benchmarks.suite --out $W/suite --reference-site /tmp/refsite --skip frame_step,engine,reference > $W/suite.txt 2>&1; echo "suite rc=$? ${SECONDS}s"; grep -A9 "^system" $W/suite.txt | tail -9
