# Session 16, call 7 (H100): the host time of queueing a decode step, piece by piece (.devwork/s16launch.py).
W=/tmp/s16c7; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s16run7.sh $W/run.sh; cp .devwork/s16launch.py $W/; tar czf $OUT/s16c7.tgz -C /tmp s16c7' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 300 python3 .devwork/s16launch.py $W/launch.json > $W/launch.txt 2>&1; echo "probe rc=$? ${SECONDS}s"; grep -v -i warn $W/launch.txt | tail -6
