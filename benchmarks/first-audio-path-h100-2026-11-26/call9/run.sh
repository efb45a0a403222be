# Session 16, call 9 (H100): the in-order step's host path between two talker passes, stamped inside the engine
# (.devwork/s16hops.py), at 1 stream and at 32.
W=/tmp/s16c9; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s16run9.sh $W/run.sh; cp .devwork/s16hops.py $W/; tar czf $OUT/s16c9.tgz -C /tmp s16c9' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
for c in 1 32; do
  timeout 150 python3 .devwork/s16hops.py $W/hops-c$c.json --concurrency $c --out $W/engine-c$c.json > $W/hops-c$c.txt 2>&1; echo "c$c rc=$? ${SECONDS}s"
  grep -v -i warn $W/hops-c$c.txt | grep -E " ms$|step ms|^ +$c " | cut -c1-300
done
