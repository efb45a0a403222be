# Session 15, call 12 (H100): over gRPC, HEAD a3dcd30 at the rates issue 14 names (1, 10, 20, 30, 40 and 60 req/s),
# 40 s each, into benchmarks/loadgen-h100-2026-11-26-schedule-ahead/.
W=/tmp/s15c12; rm -rf $W; mkdir -p $W/grpc
trap 'cp .devwork/s15run12.sh $W/run.sh; gzip -f $W/grpc/server.log; tar czf $OUT/s15c12.tgz -C /tmp s15c12' EXIT
SECONDS=0
timeout 420 bash benchmarks/device_loadgen.sh $W/grpc 1,10,20,30,40,60 40 > $W/grpc.txt 2>&1; echo "grpc rc=$? ${SECONDS}s"
grep -v "^  load" $W/grpc/loadgen.txt
