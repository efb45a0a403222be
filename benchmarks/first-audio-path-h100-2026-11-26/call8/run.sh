# Session 16, call 8 (H100): inside the engine in process, the host time of each piece of queueing a decode step
# (.devwork/s16queue.py wraps the runner's methods with a host clock), at 1 stream and at 32, one run each.
W=/tmp/s16c8; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s16run8.sh $W/run.sh; cp .devwork/s16queue.py $W/; tar czf $OUT/s16c8.tgz -C /tmp s16c8' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
for c in 1 32; do
  timeout 150 python3 .devwork/s16queue.py $W/queue-c$c.json --concurrency $c --profile-steps --out $W/engine-c$c.json > $W/queue-c$c.txt 2>&1; echo "c$c rc=$? ${SECONDS}s"
  grep -v -i warn $W/queue-c$c.txt | grep -E "calls|phases" | cut -c1-400
done
