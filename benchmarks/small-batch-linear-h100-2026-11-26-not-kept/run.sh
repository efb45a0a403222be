# Session 11, call 5 (H100): projections at 1 to 4 rows in a Triton kernel (small_batch_linear). GPU tests; the
# cold-L2 projection benchmark; the frame step and the batch-1 profile for this tree and d22f949 (.devwork/prev).
W=/tmp/s11c5; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s11c5.tgz -C /tmp s11c5' EXIT
source benchmarks/device_server.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 170 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -2 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head -20; grep -E "^E " $W/gpu_tests.txt | head -10 | cut -c1-300
timeout 200 python3 -m benchmarks.small_batch_linear --out $W/small_batch_linear.json > $W/small_batch_linear.txt 2>&1; echo "sbl rc=$?"; grep -v -i warn $W/small_batch_linear.txt
FRAME="--sizes 1.7b,0.6b --batch-sizes 1,2,4,64"
timeout 100 python3 -m benchmarks.frame_step $FRAME --out $W/frame_step-new.json > $W/frame_step-new.txt 2>&1; echo "frame new rc=$?"
(cd .devwork/prev && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 100 python3 -m benchmarks.frame_step $FRAME --out $W/frame_step-prev.json > $W/frame_step-prev.txt 2>&1; echo "frame prev rc=$?")
grep -v -i warn $W/frame_step-new.txt | tail -9; grep -v -i warn $W/frame_step-prev.txt | tail -9
timeout 60 python3 -m benchmarks.profile_step --batch 1 --out $W/profile.json > $W/profile.txt 2>&1; echo "profile rc=$?"; grep -i "kernels" $W/profile.txt | head -4
