# Session 12, call 3 (H100): which codec convolutions in fp16 cost the fidelity (probe 2), at fa38219.
W=/tmp/s12c3; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s12run3.sh $W/run.sh; cp .devwork/s12probe2.py $W/; tar czf $OUT/s12c3.tgz -C /tmp s12c3' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
timeout 400 python3 .devwork/s12probe2.py $W/probe2.json 2>&1 | grep -v -i warn | tee $W/probe2.txt
