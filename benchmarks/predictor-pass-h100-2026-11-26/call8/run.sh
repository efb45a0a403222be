# Session 17, call 8 (H100): the one-kernel call with each tile's next weights loaded before it is reduced, against
# the committed kernel (246cbf4) and the chain; the frame step at 1 and 2 rows; the engine at 32 streams, this tree
# and 2a80f82 (.devwork/prev) in turn, twice each.
W=/tmp/s17c8; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s17run8.sh .devwork/s17var3.py $W/; tar czf $OUT/s17c8.tgz -C /tmp s17c8' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 200 python3 .devwork/s17var3.py $W/variants.json > $W/variants.txt 2>&1; echo "variants rc=$? ${SECONDS}s"
grep "^{" $W/variants.txt | cut -c1-400
SECONDS=0
timeout 100 python3 -m benchmarks.frame_step --sizes 1.7b,0.6b --batch-sizes 1,2 --out $W/frame_step-new.json > $W/frame_step-new.txt 2>&1; echo "frame new rc=$? ${SECONDS}s"; grep -v -i warn $W/frame_step-new.txt | tail -5
for run in a b; do for tree in new prev; do
  SECONDS=0
  if [ $tree = new ]; then D=$PWD; else D=$PWD/.devwork/prev; fi
  (cd $D && PYTHONPATH=$D:$D/proto:/tmp/site timeout 80 python3 -m benchmarks.engine --concurrency 32 --profile-steps --out $W/engine-$tree-$run.json > $W/engine-$tree-$run.txt 2>&1; echo "engine $tree $run rc=$? ${SECONDS}s")
  grep -A1 "conc " $W/engine-$tree-$run.txt | tail -1; grep "first audio" $W/engine-$tree-$run.txt
done; done
gzip -f $W/engine-*.json
