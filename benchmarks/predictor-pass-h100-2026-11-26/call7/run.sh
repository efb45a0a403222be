# Session 17, call 7 (H100): the new GPU test file; the frame step and the engine in process (1 and 32 streams)
# for this tree and HEAD before it (.devwork/prev: git archive 2a80f82), one after the other on one machine.
W=/tmp/s17c7; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s17run7.sh $W/run.sh; tar czf $OUT/s17c7.tgz -C /tmp s17c7' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 100 python3 -m pytest -q tests/gpu/test_predictor_pass_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^E " $W/gpu_tests.txt | head -6 | cut -c1-300
FRAME="--sizes 1.7b,0.6b --batch-sizes 1,2,8,64"
SECONDS=0
timeout 120 python3 -m benchmarks.frame_step $FRAME --out $W/frame_step-new.json > $W/frame_step-new.txt 2>&1; echo "frame new rc=$? ${SECONDS}s"
SECONDS=0
(cd .devwork/prev && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 120 python3 -m benchmarks.frame_step $FRAME --out $W/frame_step-prev.json > $W/frame_step-prev.txt 2>&1; echo "frame prev rc=$? ${SECONDS}s")
grep -v -i warn $W/frame_step-new.txt | tail -9; grep -v -i warn $W/frame_step-prev.txt | tail -9
for tree in new prev; do
  SECONDS=0
  if [ $tree = new ]; then D=$PWD; else D=$PWD/.devwork/prev; fi
  (cd $D && PYTHONPATH=$D:$D/proto:/tmp/site timeout 110 python3 -m benchmarks.engine --concurrency 1,32 --profile-steps --out $W/engine-$tree.json > $W/engine-$tree.txt 2>&1; echo "engine $tree rc=$? ${SECONDS}s")
  grep -A3 "conc " $W/engine-$tree.txt
done
gzip -f $W/engine-*.json
