# Session 16, call 3 (H100): the benchmark of record over gRPC on the working tree (an open request's text sent
# without waiting for the engine core; the first-audio path metric), at 1, 10, 20, 30, 40, 60 and 80 req/s, 40 s each.
W=/tmp/s16c3; rm -rf $W; mkdir -p $W/grpc
trap 'cp .devwork/s16run3.sh $W/run.sh; gzip -f $W/grpc/server.log; tar czf $OUT/s16c3.tgz -C /tmp s16c3' EXIT
SECONDS=0
timeout 560 bash benchmarks/device_loadgen.sh $W/grpc 1,10,20,30,40,60,80 40 > $W/grpc.txt 2>&1; echo "grpc rc=$? ${SECONDS}s"
grep -v "^  load" $W/grpc/loadgen.txt
grep "first_audio_path_seconds_\(sum\|count\)" $W/grpc/metrics.txt
