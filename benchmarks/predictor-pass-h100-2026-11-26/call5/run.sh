# Session 17, call 5 (H100): variants of the one-kernel predictor call (programs per SM, warps, no barriers, prefetch).
W=/tmp/s17c5; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s17run5.sh $W/run.sh; cp .devwork/s17var2.py $W/; tar czf $OUT/s17c5.tgz -C /tmp s17c5' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 280 python3 .devwork/s17var2.py $W/variants.json > $W/variants.txt 2>&1; echo "variants rc=$? ${SECONDS}s"
grep "^{" $W/variants.txt | cut -c1-600; tail -3 $W/variants.txt
