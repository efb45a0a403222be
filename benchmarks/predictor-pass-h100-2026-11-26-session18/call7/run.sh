# Session 18, call 7 (H100): the tree to commit (two chunks in flight at one row): its kernel against e68a2c2's
# and dc4eea4's and the chain (1.7B, codebooks 2-15 in CUDA graphs, 1 and 2 rows, agreement with the chain); then the
# benchmark of record over gRPC on this tree at 1, 10, 20, 30, 40 and 60 req/s, 40 s each. Results straight to $OUT.
W=$OUT/s18c7; mkdir -p $W/grpc; cp .devwork/s18run7.sh $W/run.sh; cp .devwork/s18final.py $W/
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 90 python3 .devwork/s18final.py $W/variants.json > $W/variants.txt 2>&1; echo "variants rc=$? ${SECONDS}s"
grep "^{" $W/variants.txt | cut -c1-600; grep -i -B2 -A8 "error\|Traceback" $W/variants.txt | head -30
SECONDS=0
timeout 320 bash benchmarks/device_loadgen.sh $W/grpc 1,10,20,30,40,60 40 > $W/grpc.txt 2>&1; echo "grpc rc=$? ${SECONDS}s"
grep -v "^  load" $W/grpc/loadgen.txt; gzip -f $W/grpc/server.log 2>/dev/null; true
