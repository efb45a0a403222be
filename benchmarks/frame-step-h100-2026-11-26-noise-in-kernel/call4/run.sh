# Session 11, call 4 (H100): the sampling kernel by num_warps; then the service over gRPC at d22f949 (noise made in
# the sampling kernel), 1 to 80 req/s, 40 s each.
W=/tmp/s11c4; rm -rf $W; mkdir -p $W/grpc
trap 'tar czf $OUT/s11c4.tgz -C /tmp s11c4' EXIT
(source benchmarks/device_server.sh
 timeout 60 python3 .devwork/sweep_sampling.py $W/sweep_sampling.json > $W/sweep_sampling.txt 2>&1; echo "sweep rc=$?"; grep -v -i warn $W/sweep_sampling.txt)
timeout 520 bash benchmarks/device_loadgen.sh $W/grpc 1,10,20,30,40,60,80 40 > $W/grpc.txt 2>&1; echo "grpc rc=$?"
grep -E "rate|p95|underrun" $W/grpc/loadgen.txt | head -40
