# Session 16, call 10 (H100): is the hand-off into the runner's thread slow now and then because of the GIL? The
# in-order step's hand-offs stamped (.devwork/s16hops.py) with Python's switch interval at 5 ms (its default) and
# at 0.5 ms, at 1 stream and at 32, alternated.
W=/tmp/s16c10; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s16run10.sh $W/run.sh; cp .devwork/s16hops.py $W/; tar czf $OUT/s16c10.tgz -C /tmp s16c10' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
for run in a b; do for ms in 5 0.5; do
  name=si$ms-$run
  timeout 150 python3 .devwork/s16hops.py $W/hops-$name.json --switch-interval-ms=$ms --concurrency 1,32 --out $W/engine-$name.json > $W/hops-$name.txt 2>&1; echo "$name rc=$? ${SECONDS}s"
  grep -v -i warn $W/hops-$name.txt | grep -E "resumes  |starts  |whole|next talker queued|^ +(1|32) " | grep -v "loop resumes -> next" | cut -c1-200
done; done
