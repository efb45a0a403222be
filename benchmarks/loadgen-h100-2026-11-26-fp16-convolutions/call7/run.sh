# Session 12, call 7 (H100): the service over gRPC at 194d13e (fp16 convolutions in the codec's residual units, the
# new default on CUDA), 1 to 80 req/s, 40 s each; the same machine as call 6.
W=/tmp/s12c7; rm -rf $W; mkdir -p $W/grpc
trap 'cp .devwork/s12run7.sh $W/run.sh; gzip -f $W/grpc/server.log; tar czf $OUT/s12c7.tgz -C /tmp s12c7' EXIT
timeout 560 bash benchmarks/device_loadgen.sh $W/grpc 1,10,20,30,40,60,80 40 > $W/grpc.txt 2>&1; echo "grpc rc=$?"
grep -v "^  rate" $W/grpc/loadgen.txt
grep -i "codec" $W/grpc/server.log | head -3
