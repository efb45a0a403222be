# Session 10, call 8 (H100): the codec's window attention in one kernel a layer. GPU tests on this tree; the codec
# per call and in process at 1, 32, 128, this tree against 4909ac9 (.devwork/prev, the autotuned codec graphs).
W=/tmp/s10c8; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s10c8.tgz -C /tmp s10c8' EXIT
source benchmarks/device_server.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 150 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -2 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -20
CODEC="--batch-sizes 1,32,64,128 --chunk-lengths 1 --iterations 20 --profile 1:1,128:1"
timeout 100 python3 -m benchmarks.codec $CODEC --out $W/codec-new.json > $W/codec-new.txt 2>&1; echo "codec-new rc=$?"
(cd .devwork/prev && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 100 python3 -m benchmarks.codec $CODEC --out $W/codec-prev.json > $W/codec-prev.txt 2>&1; echo "codec-prev rc=$?")
grep -v -i warn $W/codec-new.txt | head -12; grep -v -i warn $W/codec-prev.txt | head -12
run_engine() {  # NAME DIR
  (cd $2 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 150 python3 -m benchmarks.engine --concurrency 1,32,128 --profile-steps --out $W/engine-$1.json > $W/engine-$1.txt 2>&1; echo "engine-$1 rc=$?")
  grep -A4 "conc " $W/engine-$1.txt; grep "128 phases" $W/engine-$1.txt | sed 's/.*device_prefill_inputs/device_prefill_inputs/' | cut -c1-300
}
run_engine new $PWD
run_engine prev $PWD/.devwork/prev
