# Session 11, call 3 (H100): the sampling kernel's noise in 32-bit arithmetic. GPU tests; the frame step (1.7B and
# 0.6B) and the engine in process at 1, 32, 128 for this tree and 4074296 (.devwork/prev); the step profile.
W=/tmp/s11c3; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s11c3.tgz -C /tmp s11c3' EXIT
source benchmarks/device_server.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 170 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -2 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -10 | cut -c1-300
FRAME="--sizes 1.7b,0.6b --batch-sizes 1,64,128"
timeout 100 python3 -m benchmarks.frame_step $FRAME --out $W/frame_step-new.json > $W/frame_step-new.txt 2>&1; echo "frame new rc=$?"
(cd .devwork/prev && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 100 python3 -m benchmarks.frame_step $FRAME --out $W/frame_step-prev.json > $W/frame_step-prev.txt 2>&1; echo "frame prev rc=$?")
grep -v -i warn $W/frame_step-new.txt | tail -7; grep -v -i warn $W/frame_step-prev.txt | tail -7
timeout 60 python3 -m benchmarks.profile_step --batch 1,64 --out $W/profile.json > $W/profile.txt 2>&1; echo "profile rc=$?"; grep -i "kernels" $W/profile.txt | head -4
run_engine() {  # NAME DIR
  (cd $2 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 120 python3 -m benchmarks.engine --concurrency 1,32,128 --profile-steps --out $W/engine-$1.json > $W/engine-$1.txt 2>&1; echo "engine-$1 rc=$?")
  grep -A4 "conc " $W/engine-$1.txt
}
run_engine new $PWD
run_engine prev $PWD/.devwork/prev
