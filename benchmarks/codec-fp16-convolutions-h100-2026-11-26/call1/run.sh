# Session 12, call 1 (H100): probe fp16-input convolutions in the codec against TF32 (speed in runner graphs at
# 1/32/64/128 rows, kernel profile at 128, waveform error against exact fp32).
W=/tmp/s12c1; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s12probe.py .devwork/s12run1.sh $W/; tar czf $OUT/s12c1.tgz -C /tmp s12c1' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 400 python3 .devwork/s12probe.py $W/probe.json 2>&1 | grep -v -i warn | tee $W/probe.txt
