# Session 10, call 13 (H100): the window-attention kernel reading the ring 32 slots at a time with the softmax carried
# across them. GPU tests; the codec per call, this tree against c22e79c (.devwork/c22, the kernel as committed).
W=/tmp/s10c13; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s10c13.tgz -C /tmp s10c13' EXIT
source benchmarks/device_server.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 150 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -2 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -20
CODEC="--batch-sizes 1,32,64,128 --chunk-lengths 1 --iterations 20 --profile 1:1,128:1"
timeout 100 python3 -m benchmarks.codec $CODEC --out $W/codec-new.json > $W/codec-new.txt 2>&1; echo "codec-new rc=$?"
(cd .devwork/c22 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 100 python3 -m benchmarks.codec $CODEC --out $W/codec-c22.json > $W/codec-c22.txt 2>&1; echo "codec-c22 rc=$?")
grep -v -i warn $W/codec-new.txt | head -5; grep -v -i warn $W/codec-c22.txt | head -5
grep -H "_window_attention_kernel" $W/codec-*.txt
