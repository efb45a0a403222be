# Session 17, call 11 (H100): the GPU test file again; whether stacking the predictor's weights slows the chain at
# large batch (2a80f82's runner, then its weights stacked by this tree's PredictorPass and its graphs recaptured).
W=/tmp/s17c11; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s17run11.sh .devwork/s17stack.py $W/; tar czf $OUT/s17c11.tgz -C /tmp s17c11' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 100 python3 -m pytest -q tests/gpu/test_predictor_pass_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^E " $W/gpu_tests.txt | head -4 | cut -c1-300
SECONDS=0
NEW=$PWD/tts_service/runner/predictor_pass.py
(cd .devwork/prev && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 150 python3 ../s17stack.py $NEW $W/stack.json > $W/stack.txt 2>&1; echo "stack rc=$? ${SECONDS}s")
grep -v -i warn $W/stack.txt | tail -8
