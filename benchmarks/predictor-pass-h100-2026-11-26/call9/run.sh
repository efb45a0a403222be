# Session 17, call 9 (H100): the tree to commit (the one-kernel predictor call at one and two rows, pipelined
# tiles): the GPU suite; the fidelity suite step; the frame step table (1.7B, 0.6B, 1 to 256 rows) and the
# profile at 1 and 2 rows, for this tree and 2a80f82 (.devwork/prev) on the same machine.
W=/tmp/s17c9; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s17run9.sh $W/run.sh; tar czf $OUT/s17c9.tgz -C /tmp s17c9' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
[ -d /tmp/refsite ] || install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 200 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -6 | cut -c1-300
SECONDS=0; mkdir -p $W/suite
timeout 120 python3 -m benchmarks.suite --out $W/suite --reference-site /tmp/refsite --skip frame_step,engine,reference > $W/suite.txt 2>&1; echo "suite rc=$? ${SECONDS}s"; grep -A9 "^system" $W/suite.txt | tail -9
FRAME="--sizes 1.7b,0.6b --batch-sizes 1,2,4,8,32,64,128,256"
for tree in new prev; do
  if [ $tree = new ]; then D=$PWD; else D=$PWD/.devwork/prev; fi
  SECONDS=0
  (cd $D && PYTHONPATH=$D:$D/proto:/tmp/site timeout 100 python3 -m benchmarks.frame_step $FRAME --out $W/frame_step-$tree.json > $W/frame_step-$tree.txt 2>&1; echo "frame $tree rc=$? ${SECONDS}s")
  grep -v -i warn $W/frame_step-$tree.txt | tail -17
  SECONDS=0
  (cd $D && PYTHONPATH=$D:$D/proto:/tmp/site timeout 60 python3 -m benchmarks.profile_step --batch 1,2 --out $W/profile-$tree.json > $W/profile-$tree.txt 2>&1; echo "profile $tree rc=$? ${SECONDS}s")
  grep "kernels" $W/profile-$tree.txt
done
