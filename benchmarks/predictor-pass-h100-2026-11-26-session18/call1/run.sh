# Session 18, call 1 (H100): the predictor kernel's tiles streamed through shared memory (num_stages 1-4) against
# the committed kernel (dc4eea4) and the chain, with its phases stamped; the GPU test file; the frame step at 1
# and 2 rows for this tree and dc4eea4 (.devwork/prev) on one machine.
W=/tmp/s18c1; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s18run1.sh $W/run.sh; cp .devwork/s18var.py $W/; tar czf $OUT/s18c1.tgz -C /tmp s18c1' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 300 python3 .devwork/s18var.py $W/variants.json > $W/variants.txt 2>&1; echo "variants rc=$? ${SECONDS}s"
grep "^{" $W/variants.txt | cut -c1-1500; grep -i -B2 -A8 "error\|Traceback" $W/variants.txt | head -40
SECONDS=0
timeout 150 python3 -m pytest -q tests/gpu/test_predictor_pass_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^E " $W/gpu_tests.txt | head -6 | cut -c1-300
for tree in new prev; do
  if [ $tree = new ]; then D=$PWD; else D=$PWD/.devwork/prev; fi
  SECONDS=0
  (cd $D && PYTHONPATH=$D:$D/proto:/tmp/site timeout 100 python3 -m benchmarks.frame_step --sizes 1.7b,0.6b --batch-sizes 1,2 --out $W/frame_step-$tree.json > $W/frame_step-$tree.txt 2>&1; echo "frame $tree rc=$? ${SECONDS}s")
  grep -v -i warn $W/frame_step-$tree.txt | tail -5
done
