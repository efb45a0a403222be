# Session 17, call 12 (H100): the frame step at 4, 128 and 256 rows only (no bucket that runs the one-kernel call),
# this tree and 2a80f82 (.devwork/prev), new-prev-prev-new: is call 10's 2-4% at these rows the kernel's
# earlier runs in the same process, or the tree?
W=/tmp/s17c12; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s17run12.sh $W/run.sh; tar czf $OUT/s17c12.tgz -C /tmp s17c12' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
FRAME="--sizes 1.7b --batch-sizes 4,128,256"
for run in new-a prev-a prev-b new-b; do
  tree=${run%-*}
  if [ $tree = new ]; then D=$PWD; else D=$PWD/.devwork/prev; fi
  SECONDS=0
  (cd $D && PYTHONPATH=$D:$D/proto:/tmp/site timeout 60 python3 -m benchmarks.frame_step $FRAME --out $W/frame_step-$run.json > $W/frame_step-$run.txt 2>&1; echo "frame $run rc=$? ${SECONDS}s")
  grep -v -i warn $W/frame_step-$run.txt | tail -5 | awk '{print $1, $2, $3}' | tr '\n' ';'; echo
done
