# Session 17, call 1 (H100): the one-kernel predictor call, checked and timed against the chain.
W=/tmp/s17c1; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s17run1.sh $W/run.sh; cp .devwork/s17pred.py $W/; tar czf $OUT/s17c1.tgz -C /tmp s17c1' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 240 python3 .devwork/s17pred.py $W/pred.json 1.7b,0.6b > $W/pred.txt 2>&1; echo "probe rc=$? ${SECONDS}s"
grep -v '"codebook": [3-9]\|"codebook": 1[0-4]' $W/pred.txt | cut -c1-400 | tail -40
SECONDS=0
timeout 200 python3 -m benchmarks.frame_step --sizes 1.7b,0.6b --batch-sizes 1,2,4,8,64 --out $W/frame_step-new.json > $W/frame_step-new.txt 2>&1; echo "frame_step rc=$? ${SECONDS}s"; cat $W/frame_step-new.txt | tail -12
