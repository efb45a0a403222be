# Session 10, call 4 (H100): gRPC open-loop A/B, 30 s per rate: 9f55939 + codec autotuning (.devwork/tuned)
# against this tree (the same plus the codec on its own stream), one after the other on one machine.
W=/tmp/s10c4; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s10c4.tgz -C /tmp s10c4' EXIT
ln -sfn $PWD/.whl .devwork/tuned/.whl
(cd .devwork/tuned && timeout 270 bash benchmarks/device_loadgen.sh $W/tuned 1,20,40,60,80 30 > $W/tuned.log 2>&1; echo "tuned rc=$?")
cat $W/tuned/loadgen.txt
timeout 270 bash benchmarks/device_loadgen.sh $W/new 1,20,40,60,80 30 > $W/new.log 2>&1; echo "new rc=$?"
cat $W/new/loadgen.txt
