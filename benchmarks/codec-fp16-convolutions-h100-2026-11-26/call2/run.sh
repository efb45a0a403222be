# Session 12, call 2 (H100): fp16 codec convolutions (fa38219). GPU tests; the codec alone in fp32 (TF32) and fp16
# convolutions at 1/8/32/64/128 rows, one frame, with a profile at 128; codec fidelity against the reference.
W=/tmp/s12c2; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s12run2.sh $W/run.sh; tar czf $OUT/s12c2.tgz -C /tmp s12c2' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
install /tmp/site .whl/site/*.whl
install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 200 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -2 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head -20; grep -E "^E " $W/gpu_tests.txt | head -10 | cut -c1-300
CODEC="--batch-sizes 1,8,32,64,128 --chunk-lengths 1 --iterations 30 --profile 128:1"
for conv in float32 float16; do
  timeout 120 python3 -m benchmarks.codec $CODEC --codec-convolution-dtype $conv --out $W/codec-$conv.json > $W/codec-$conv.txt 2>&1; echo "codec $conv rc=$?"
  grep -v -i warn $W/codec-$conv.txt | head -14
done
PYTHONPATH=/tmp/refsite:$PYTHONPATH timeout 150 python3 -m benchmarks.codec_fidelity --rows 4 --frames 150 --out $W/codec_fidelity.json > $W/codec_fidelity.txt 2>&1; echo "fidelity rc=$?"
tail -9 $W/codec_fidelity.txt
