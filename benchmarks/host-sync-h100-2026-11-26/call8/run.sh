# Session 14, call 8 (H100): HEAD cf65db3 (the codec's attention reads and writes the rings in place) against
# 2625636 (.devwork/prev). The whole GPU suite on HEAD; the codec alone at 1, 32, 96 and 128 rows (both trees);
# the engine at 128 streams with 512 requests, the two trees alternated twice.
W=/tmp/s14c8; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s14run8.sh $W/run.sh; tar czf $OUT/s14c8.tgz -C /tmp s14c8' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 200 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -6 | cut -c1-300
codec() { (cd $1 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 90 python3 -m benchmarks.codec --batch-sizes 1,32,96,128 --chunk-lengths 1 --iterations 20 --profile 128:1 --out $W/codec-$2.json > $W/codec-$2.txt 2>&1; echo "codec $2 rc=$? ${SECONDS}s"; grep -v -i warn $W/codec-$2.txt | tail -8)
}
codec . new
codec .devwork/prev prev
bench() { (cd $1 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 80 python3 -m benchmarks.engine --profile-steps --out $W/engine-$2.json "${@:3}" > $W/engine-$2.txt 2>&1; echo "engine $2 rc=$? ${SECONDS}s"; grep -v -i warn $W/engine-$2.txt | grep -A9 "conc " | grep -v "first audio")
}
bench . new-512-a --concurrency 128 --requests-per-level 512
bench .devwork/prev prev-512-a --concurrency 128 --requests-per-level 512
bench . new-512-b --concurrency 128 --requests-per-level 512
bench .devwork/prev prev-512-b --concurrency 128 --requests-per-level 512
