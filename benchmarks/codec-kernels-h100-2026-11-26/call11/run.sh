# Session 15, call 11 (H100): the service's ceiling over gRPC against the engine in process, HEAD (steps scheduled
# ahead from 64 decodes), closed loop at 32 and 128 in flight, 1024 requests each.
W=/tmp/s15c11; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s15run11.sh $W/run.sh; gzip -f $W/*/server.log 2>/dev/null; tar czf $OUT/s15c11.tgz -C /tmp s15c11' EXIT
SECONDS=0
timeout 500 bash benchmarks/device_ceiling.sh $W 32,128 1024 > $W/ceiling.txt 2>&1; echo "ceiling rc=$? ${SECONDS}s"
tail -8 $W/ceiling.txt
