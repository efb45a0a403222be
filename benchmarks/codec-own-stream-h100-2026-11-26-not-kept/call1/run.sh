# Session 10, call 1 (H100): GPU tests on this tree; engine in process at 1, 32, 128 for this tree (codec on its own
# stream) and 9f55939 (.devwork/base); the frame step alone at 1 and 128.
W=/tmp/s10c1; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s10c1.tgz -C /tmp s10c1' EXIT
source benchmarks/device_server.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 150 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -2 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head
timeout 140 python3 -m benchmarks.engine --concurrency 1,32,128 --profile-steps --out $W/engine-new.json > $W/engine-new.txt 2>&1; echo "engine-new rc=$?"
grep -A4 "conc " $W/engine-new.txt; grep phases $W/engine-new.txt | cut -c1-260
(cd .devwork/base && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 140 python3 -m benchmarks.engine --concurrency 1,32,128 --profile-steps --out $W/engine-base.json > $W/engine-base.txt 2>&1; echo "engine-base rc=$?")
grep -A4 "conc " $W/engine-base.txt; grep phases $W/engine-base.txt | cut -c1-260
timeout 100 python3 -m benchmarks.frame_step --sizes 1.7b --batch-sizes 1,128 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$?"
grep -v -i warn $W/frame_step.txt | tail -6
