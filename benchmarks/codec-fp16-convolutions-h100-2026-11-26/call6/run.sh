# Session 12, call 6 (H100): 194d13e, fp16 convolutions in the residual units, on by default on CUDA. GPU tests;
# codec fidelity against the reference; the codec alone (auto against float32); the engine in process at 1, 32, 128
# (auto against float32); the frame step at 128 rows.
W=/tmp/s12c6; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s12run6.sh $W/run.sh; tar czf $OUT/s12c6.tgz -C /tmp s12c6' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
install /tmp/site .whl/site/*.whl
install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 170 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -5 | cut -c1-300
PYTHONPATH=/tmp/refsite:$PYTHONPATH timeout 90 python3 -m benchmarks.codec_fidelity --rows 4 --frames 150 --out $W/codec_fidelity.json > $W/codec_fidelity.txt 2>&1; echo "fidelity rc=$?"
tail -9 $W/codec_fidelity.txt
CODEC="--batch-sizes 1,32,64,128 --chunk-lengths 1 --iterations 30 --profile 128:1"
for conv in auto float32; do
  timeout 60 python3 -m benchmarks.codec $CODEC --codec-convolution-dtype $conv --out $W/codec-$conv.json > $W/codec-$conv.txt 2>&1; echo "codec $conv rc=$?"
  grep -v -i warn $W/codec-$conv.txt | head -5 | tail -4; grep "kernels," $W/codec-$conv.txt
done
for conv in auto float32; do
  timeout 130 python3 -m benchmarks.engine --concurrency 1,32,128 --profile-steps --codec-convolution-dtype $conv --out $W/engine-$conv.json > $W/engine-$conv.txt 2>&1; echo "engine $conv rc=$?"
  grep -A4 "conc " $W/engine-$conv.txt
done
timeout 50 python3 -m benchmarks.frame_step --sizes 1.7b --batch-sizes 128 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$?"; grep -v -i warn $W/frame_step.txt | tail -2
