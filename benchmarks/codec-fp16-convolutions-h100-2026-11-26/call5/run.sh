# Session 12, call 5 (H100): probe 3, variants of the blocks-only fp16 convolutions (3d6c7e5).
W=/tmp/s12c5; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s12run5.sh $W/run.sh; cp .devwork/s12probe3.py $W/; tar czf $OUT/s12c5.tgz -C /tmp s12c5' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
timeout 400 python3 .devwork/s12probe3.py $W/probe3.json 2>&1 | grep -v -i warn | tee $W/probe3.txt
