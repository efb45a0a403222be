# Session 15, call 7 (H100), the machine of call 6: the engine at 128 streams, 512 requests, the working tree against
# 2e97079 (.devwork/prev), alternated three times with the older tree first (calls 5 and 6 ran the new tree first).
W=/tmp/s15c7; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s15run7.sh $W/run.sh; tar czf $OUT/s15c7.tgz -C /tmp s15c7' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1
SECONDS=0
bench() { (cd $1 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 80 python3 -m benchmarks.engine --profile-steps --out $W/engine-$2.json "${@:3}" > $W/engine-$2.txt 2>&1; echo "engine $2 rc=$? ${SECONDS}s"; grep -v -i warn $W/engine-$2.txt | grep -A9 "conc " | grep -v "first audio" | tail -2 | cut -c1-200)
}
for run in a b c; do
bench .devwork/prev prev-512-$run --concurrency 128 --requests-per-level 512
bench . new-512-$run --concurrency 128 --requests-per-level 512
done
