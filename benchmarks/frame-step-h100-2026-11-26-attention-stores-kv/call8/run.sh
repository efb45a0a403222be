# Session 11, call 8 (H100): the service over gRPC at daedbc3, 1 to 80 req/s, 40 s each.
W=/tmp/s11c8; rm -rf $W; mkdir -p $W/grpc
trap 'tar czf $OUT/s11c8.tgz -C /tmp s11c8' EXIT
timeout 560 bash benchmarks/device_loadgen.sh $W/grpc 1,10,20,30,40,60,80 40 > $W/grpc.txt 2>&1; echo "grpc rc=$?"
grep -v "^  rate" $W/grpc/loadgen.txt
