# Session 15, call 4 (H100): the codec call at 128 rows op by op with shapes, and the window attention kernel's
# tiles and warps swept (.devwork/s15probe.py).
W=/tmp/s15c4; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s15run4.sh $W/run.sh; cp .devwork/s15probe.py $W/; tar czf $OUT/s15c4.tgz -C /tmp s15c4' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1
SECONDS=0
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 200 python3 .devwork/s15probe.py $W > $W/probe.txt 2>&1; echo "probe rc=$? ${SECONDS}s"; grep -v -i warn $W/probe.txt | head -90 | cut -c1-250
