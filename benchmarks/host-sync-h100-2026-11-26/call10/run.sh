# Session 14, call 10 (H100): over gRPC, HEAD (the codec's rings in place, and every change of the session) at 1 to
# 80 req/s, 40 s each.
W=/tmp/s14c10; rm -rf $W; mkdir -p $W/grpc
trap 'cp .devwork/s14run10.sh $W/run.sh; gzip -f $W/grpc/server.log; tar czf $OUT/s14c10.tgz -C /tmp s14c10' EXIT
SECONDS=0
timeout 400 bash benchmarks/device_loadgen.sh $W/grpc 1,10,20,30,40,60,80 40 > $W/grpc.txt 2>&1; echo "grpc rc=$? ${SECONDS}s"
grep -v "^  rate" $W/grpc/loadgen.txt | grep -v "^  load"
