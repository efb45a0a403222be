# Session 10, call 12 (H100): the window-attention kernel loading each ring where it uses it, 8 warps. GPU tests; the codec
# per call, this tree against c22e79c (.devwork/c22, the first version of the kernel) and 4909ac9 (.devwork/prev).
W=/tmp/s10c12; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s10c12.tgz -C /tmp s10c12' EXIT
source benchmarks/device_server.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 150 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -2 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -20
CODEC="--batch-sizes 1,32,64,128 --chunk-lengths 1 --iterations 20 --profile 1:1,128:1"
timeout 100 python3 -m benchmarks.codec $CODEC --out $W/codec-new.json > $W/codec-new.txt 2>&1; echo "codec-new rc=$?"
(cd .devwork/prev && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 100 python3 -m benchmarks.codec $CODEC --out $W/codec-prev.json > $W/codec-prev.txt 2>&1; echo "codec-prev rc=$?")
grep -v -i warn $W/codec-new.txt | head -12; grep -v -i warn $W/codec-prev.txt | head -12
(cd .devwork/c22 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 100 python3 -m benchmarks.codec $CODEC --out $W/codec-c22.json > $W/codec-c22.txt 2>&1; echo "codec-c22 rc=$?")
grep -v -i warn $W/codec-c22.txt | head -5
grep -h -B1 "_window_attention_kernel" $W/codec-*.txt
