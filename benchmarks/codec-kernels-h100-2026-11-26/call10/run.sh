# Session 15, call 10 (H100), the machine of call 9: over gRPC, HEAD 586a718 at 1, 20, 40, 60 and 80 req/s, 40 s
# each (an older tree would not fit the device call's carry limit beside the gRPC wheels).
W=/tmp/s15c10; rm -rf $W; mkdir -p $W/grpc
trap 'cp .devwork/s15run10.sh $W/run.sh; gzip -f $W/grpc/server.log; tar czf $OUT/s15c10.tgz -C /tmp s15c10' EXIT
SECONDS=0
timeout 400 bash benchmarks/device_loadgen.sh $W/grpc 1,20,40,60,80 40 > $W/grpc.txt 2>&1; echo "grpc rc=$? ${SECONDS}s"
grep -v "^  load" $W/grpc/loadgen.txt
