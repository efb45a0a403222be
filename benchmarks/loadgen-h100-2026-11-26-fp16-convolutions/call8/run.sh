# Session 12, call 8 (H100): issue 14's 90% target measured directly, at 1eaf5d3: the service over gRPC in a closed
# loop (SynthesizeOnline, 1,024 requests of the load generator's texts at 32 and at 128 in flight), then, with the
# server stopped, the engine in process on the same requests (--workload loadgen --non-streaming-text, as the
# server runs whole-text calls on CustomVoice).
W=/tmp/s12c8; rm -rf $W; mkdir -p $W/grpc
trap 'cp .devwork/s12run8.sh $W/run.sh; gzip -f $W/grpc/server.log; tar czf $OUT/s12c8.tgz -C /tmp s12c8' EXIT
source benchmarks/device_server.sh
start_server $W/grpc random:1.7b-custom_voice 50151 --metrics-port 9464 --max-calls-per-caller 100000
echo "serving after ${SECONDS}s"
LG="python3 -m clients.loadgen --server 127.0.0.1:50151 --rpc online --seed 1"
timeout 60 $LG --concurrency 8 --requests 32 --out $W/grpc/warmup.json.gz | tail -1
for c in 32 128; do
  timeout 120 $LG --concurrency $c --requests 1024 --out $W/grpc/loadgen-c$c.json.gz | tee -a $W/grpc/loadgen.txt | tail -1
done
kill -TERM $server; wait $server 2>/dev/null; trap 'cp .devwork/s12run8.sh $W/run.sh; gzip -f $W/grpc/server.log; tar czf $OUT/s12c8.tgz -C /tmp s12c8' EXIT
echo "server stopped after ${SECONDS}s"
timeout 200 python3 -m benchmarks.engine --concurrency 32,128 --workload loadgen --seed 1 --requests-per-level 1024 --non-streaming-text --profile-steps --out $W/engine-loadgen.json > $W/engine-loadgen.txt 2>&1; echo "engine rc=$?"
grep -A3 "conc " $W/engine-loadgen.txt
