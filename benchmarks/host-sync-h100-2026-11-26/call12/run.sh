# Session 14, call 12 (H100): HEAD. Issue 14's ceiling comparison: the server in a closed loop at 32 and 128 calls in
# flight, 1,024 requests each, then the engine in process on the same requests.
W=/tmp/s14c12; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s14run12.sh $W/run.sh; gzip -f $W/grpc/server.log $W/engine-loadgen.json; tar czf $OUT/s14c12.tgz -C /tmp s14c12' EXIT
SECONDS=0
timeout 500 bash benchmarks/device_ceiling.sh $W 32,128 1024 > $W/ceiling.txt 2>&1; echo "ceiling rc=$? ${SECONDS}s"
grep -v "^  load" $W/grpc/loadgen.txt; grep -v -i warn $W/engine-loadgen.txt | grep -A4 "conc " | grep -v phases; tail -5 $W/ceiling.txt
