# Session 17, call 13 (H100): the GPU test file with the runner's switch; the engine in process at 1 and 2 streams
# with the predictor kernel and without it (--no-predictor-kernel), one tree, one machine.
W=/tmp/s17c13; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s17run13.sh $W/run.sh; tar czf $OUT/s17c13.tgz -C /tmp s17c13' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 100 python3 -m pytest -q tests/gpu/test_predictor_pass_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^E " $W/gpu_tests.txt | head -4 | cut -c1-300
for run in kernel chain; do
  SECONDS=0
  FLAG=""; [ $run = chain ] && FLAG="--no-predictor-kernel"
  timeout 80 python3 -m benchmarks.engine --concurrency 1,2 --requests-per-level 16 --profile-steps $FLAG --out $W/engine-$run.json > $W/engine-$run.txt 2>&1; echo "engine $run rc=$? ${SECONDS}s"
  grep -A2 "conc " $W/engine-$run.txt; grep "first audio" $W/engine-$run.txt
done
gzip -f $W/engine-*.json
