# Session 15, call 2 (H100), same machine as call 1: HEAD + benchmarks/overlap.py. How far the frames and the codec overlap when the host
# never waits (the ceiling of asynchronous scheduling), and the engine at 128 streams, 512 requests, on one machine.
W=/tmp/s15c2; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s15run2.sh $W/run.sh; tar czf $OUT/s15c2.tgz -C /tmp s15c2' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 150 python3 -m benchmarks.overlap --batch-sizes 32,96,128 --out $W/overlap.json > $W/overlap.txt 2>&1; echo "overlap rc=$? ${SECONDS}s"; grep -v -i warn $W/overlap.txt | tail -6
