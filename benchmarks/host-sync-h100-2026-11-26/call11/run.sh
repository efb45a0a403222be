# Session 14, call 11 (call 10's machine): over gRPC, d1169e2 (.devwork/prev, call 3's tree) then HEAD again, at 20,
# 60 and 80 req/s, 40 s each.
W=/tmp/s14c11; rm -rf $W; mkdir -p $W/grpc-prev $W/grpc-new
trap 'cp .devwork/s14run11.sh $W/run.sh; gzip -f $W/grpc-*/server.log; tar czf $OUT/s14c11.tgz -C /tmp s14c11' EXIT
SECONDS=0
ln -sfn $PWD/.whl .devwork/prev/.whl
(cd .devwork/prev && timeout 200 bash benchmarks/device_loadgen.sh $W/grpc-prev 20,60,80 40 > $W/grpc-prev.txt 2>&1; echo "grpc prev rc=$? ${SECONDS}s")
grep -v "^  load" $W/grpc-prev/loadgen.txt
timeout 200 bash benchmarks/device_loadgen.sh $W/grpc-new 20,60,80 40 > $W/grpc-new.txt 2>&1; echo "grpc new rc=$? ${SECONDS}s"
grep -v "^  load" $W/grpc-new/loadgen.txt
