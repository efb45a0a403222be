# Session 10, call 3 (H100): GPU tests on this tree (codec on its own stream, codec graphs autotuned); engine in
# process at 1, 32, 128 for this tree, for 9f55939 plus autotuning alone (.devwork/tuned), and for 9f55939.
W=/tmp/s10c3; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s10c3.tgz -C /tmp s10c3' EXIT
source benchmarks/device_server.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 150 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -2 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head
timeout 100 python3 -m benchmarks.codec --batch-sizes 1,32,64,128 --chunk-lengths 1 --iterations 20 --out $W/codec-new.json > $W/codec-new.txt 2>&1; echo "codec rc=$?"
grep -v -i warn $W/codec-new.txt | head -9
run_engine() {  # NAME DIR
  (cd $2 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site /usr/bin/time -f "$1 wall %e s" timeout 150 python3 -m benchmarks.engine --concurrency 1,32,128 --profile-steps --out $W/engine-$1.json > $W/engine-$1.txt 2>&1; echo "engine-$1 rc=$?")
  grep -A4 "conc " $W/engine-$1.txt; grep wall $W/engine-$1.txt; grep "128 phases" $W/engine-$1.txt | sed 's/.*device_prefill_inputs/device_prefill_inputs/' | cut -c1-300
}
run_engine new $PWD
run_engine tuned $PWD/.devwork/tuned
run_engine base $PWD/.devwork/base
