# Session 17, call 10 (H100): the GPU test file again (near ties); the frame step at 4 to 256 rows for this tree
# and 2a80f82 (.devwork/prev) in turn, new-prev-prev-new, on one machine (call 9 read 2-6% slower for this tree
# at rows that never use the kernel).
W=/tmp/s17c10; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s17run10.sh $W/run.sh; tar czf $OUT/s17c10.tgz -C /tmp s17c10' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 100 python3 -m pytest -q tests/gpu/test_predictor_pass_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^E " $W/gpu_tests.txt | head -4 | cut -c1-300
FRAME="--sizes 1.7b --batch-sizes 1,4,64,128,256"
for run in new-a prev-a prev-b new-b; do
  tree=${run%-*}
  if [ $tree = new ]; then D=$PWD; else D=$PWD/.devwork/prev; fi
  SECONDS=0
  (cd $D && PYTHONPATH=$D:$D/proto:/tmp/site timeout 60 python3 -m benchmarks.frame_step $FRAME --out $W/frame_step-$run.json > $W/frame_step-$run.txt 2>&1; echo "frame $run rc=$? ${SECONDS}s")
  grep -v -i warn $W/frame_step-$run.txt | tail -5 | awk '{print $1, $2, $3}' | tr '\n' ';'; echo
done
