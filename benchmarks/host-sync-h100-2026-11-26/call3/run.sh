# Session 14, call 3 (H100): over gRPC, HEAD (a step queued without waiting for the device) at 1 to 80 req/s, 40 s
# each, then 1b966f9 (.devwork/prev) at 20, 60 and 80 req/s on the same machine.
W=/tmp/s14c3; rm -rf $W; mkdir -p $W/grpc-new $W/grpc-prev
trap 'cp .devwork/s14run3.sh $W/run.sh; gzip -f $W/grpc-*/server.log; tar czf $OUT/s14c3.tgz -C /tmp s14c3' EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
timeout 370 bash benchmarks/device_loadgen.sh $W/grpc-new 1,10,20,30,40,60,80 40 > $W/grpc-new.txt 2>&1; echo "grpc new rc=$? ${SECONDS}s"
grep -v "^  rate" $W/grpc-new/loadgen.txt
ln -sfn $PWD/.whl .devwork/prev/.whl
(cd .devwork/prev && timeout 200 bash benchmarks/device_loadgen.sh $W/grpc-prev 20,60,80 40 > $W/grpc-prev.txt 2>&1; echo "grpc prev rc=$? ${SECONDS}s")
grep -v "^  rate" $W/grpc-prev/loadgen.txt
