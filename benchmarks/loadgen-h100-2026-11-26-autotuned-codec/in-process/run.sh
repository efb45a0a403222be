# Session 10, call 5 (H100): at 5b54fa0 (codec graphs autotuned): GPU tests; engine in process at
# 1, 32, 128 for this tree and 9f55939; the frame step alone at 1 and 128.
W=/tmp/s10c5; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s10c5.tgz -C /tmp s10c5' EXIT
source benchmarks/device_server.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 150 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -2 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head
run_engine() {  # NAME DIR
  (cd $2 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site /usr/bin/time -f "$1 wall %e s" timeout 150 python3 -m benchmarks.engine --concurrency 1,32,128 --profile-steps --out $W/engine-$1.json > $W/engine-$1.txt 2>&1; echo "engine-$1 rc=$?")
  grep -A4 "conc " $W/engine-$1.txt; grep wall $W/engine-$1.txt; grep "128 phases" $W/engine-$1.txt | sed 's/.*device_prefill_inputs/device_prefill_inputs/' | cut -c1-300
}
run_engine new $PWD
run_engine base $PWD/.devwork/base
timeout 100 python3 -m benchmarks.frame_step --sizes 1.7b --batch-sizes 1,128 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$?"
grep -v -i warn $W/frame_step.txt | tail -3
