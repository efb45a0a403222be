# Session 13, call 4 (H100): HEAD d8b9cd0 (= c0fbc41: the codec on its own stream, the decodes' talker pass before
# the prefills) against bb415d3 (.devwork/prev), in process at 128 streams, 512 requests, alternated twice; the frame
# step at 128 rows; then HEAD over gRPC at 1, 20, 40 and 60 req/s, 40 s each.
W=/tmp/s13c4; rm -rf $W; mkdir -p $W/grpc
trap 'cp .devwork/s13run4.sh $W/run.sh; gzip -f $W/grpc/server.log; tar czf $OUT/s13c4.tgz -C /tmp s13c4' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/site/*.whl
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
bench() { (cd $1 && PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 100 python3 -m benchmarks.engine --concurrency 128 --requests-per-level 512 --profile-steps --out $W/engine-$2.json > $W/engine-$2.txt 2>&1; echo "engine $2 rc=$?"; grep -v -i warn $W/engine-$2.txt | grep -A3 "conc " | grep -v "first audio")
}
bench . new-a
bench .devwork/prev prev-a
bench . new-b
bench .devwork/prev prev-b
(PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 40 python3 -m benchmarks.frame_step --sizes 1.7b --batch-sizes 128 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$?"; grep -v -i warn $W/frame_step.txt | tail -1)
timeout 270 bash benchmarks/device_loadgen.sh $W/grpc 1,20,40,60 40 > $W/grpc.txt 2>&1; echo "grpc rc=$?"
grep -v "^  rate" $W/grpc/loadgen.txt
