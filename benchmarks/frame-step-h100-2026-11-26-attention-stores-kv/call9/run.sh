# Session 11, call 9 (H100): the service over gRPC at d22f949 (.devwork/prev) and daedbc3 (this tree) at 1, 20,
# 40, 80 req/s, 40 s each, one after the other on one machine.
W=/tmp/s11c9; rm -rf $W; mkdir -p $W/prev $W/new
trap 'tar czf $OUT/s11c9.tgz -C /tmp s11c9' EXIT
ln -sfn $PWD/.whl .devwork/prev/.whl
(cd .devwork/prev && timeout 270 bash benchmarks/device_loadgen.sh $W/prev 1,20,40,80 40 > $W/prev.txt 2>&1; echo "grpc prev rc=$?")
grep -v "^  rate" $W/prev/loadgen.txt
timeout 270 bash benchmarks/device_loadgen.sh $W/new 1,20,40,80 40 > $W/new.txt 2>&1; echo "grpc new rc=$?"
grep -v "^  rate" $W/new/loadgen.txt
