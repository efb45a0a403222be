# Session 11, call 1 (H100): the residual unit's snake + kernel-1 conv + residual add in one kernel. GPU tests; the
# kernel's tile sweep; the codec per call, this tree against 4074296 (.devwork/prev: the blocked window attention);
# codec fidelity against exact fp32 for both.
W=/tmp/s11c1; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s11c1.tgz -C /tmp s11c1' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
install /tmp/site .whl/site/*.whl
install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 170 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -2 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -20
timeout 90 python3 .devwork/sweep_pointwise.py $W/sweep.json > $W/sweep.txt 2>&1; echo "sweep rc=$?"; cut -c1-900 $W/sweep.txt | grep -v -i warn
CODEC="--batch-sizes 1,32,64,128 --chunk-lengths 1 --iterations 20 --profile 1:1,128:1"
timeout 100 python3 -m benchmarks.codec $CODEC --out $W/codec-new.json > $W/codec-new.txt 2>&1; echo "codec-new rc=$?"
(cd .devwork/prev && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 100 python3 -m benchmarks.codec $CODEC --out $W/codec-prev.json > $W/codec-prev.txt 2>&1; echo "codec-prev rc=$?")
grep -v -i warn $W/codec-new.txt | head -5; grep -v -i warn $W/codec-prev.txt | head -5
PYTHONPATH=/tmp/refsite:$PYTHONPATH timeout 120 python3 -m benchmarks.codec_fidelity --rows 4 --frames 150 --out $W/codec_fidelity-new.json > $W/fid-new.txt 2>&1; echo "fid new rc=$?"; tail -8 $W/fid-new.txt
(cd .devwork/prev && PYTHONPATH=/tmp/refsite:$PWD:$PWD/proto:/tmp/site timeout 120 python3 -m benchmarks.codec_fidelity --rows 4 --frames 150 --out $W/codec_fidelity-prev.json > $W/fid-prev.txt 2>&1; echo "fid prev rc=$?"; tail -8 $W/fid-prev.txt)
