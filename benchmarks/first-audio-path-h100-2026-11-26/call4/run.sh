# Session 16, call 4 (H100): when to schedule steps ahead. The same tree over gRPC at 60 and 80 req/s (40 s each),
# with steps scheduled ahead from 32 decodes a step, from 64 (the default) and never.
W=/tmp/s16c4; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s16run4.sh $W/run.sh; gzip -f $W/*/server.log; tar czf $OUT/s16c4.tgz -C /tmp s16c4' EXIT
SECONDS=0
for threshold in 32 64 off; do
  timeout 190 bash benchmarks/device_loadgen.sh $W/ahead-$threshold 60,80 40 --min-decodes-to-schedule-ahead $threshold > $W/ahead-$threshold.txt 2>&1; echo "ahead from $threshold rc=$? ${SECONDS}s"
  grep -v "^  load" $W/ahead-$threshold/loadgen.txt
  grep "engine_step_seconds_\(sum\|count\)" $W/ahead-$threshold/metrics.txt | sed 's/{.*}//'
done
