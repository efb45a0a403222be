# Session 16, call 11 (H100): steps scheduled ahead from 64 decodes (the default) against never, over gRPC at
# 80 req/s for 40 s, each server in turn, twice (a, b), on one machine.
W=/tmp/s16c11; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s16run11.sh $W/run.sh; gzip -f $W/*/server.log; tar czf $OUT/s16c11.tgz -C /tmp s16c11' EXIT
SECONDS=0
for run in a b; do for threshold in 64 off; do
  timeout 140 bash benchmarks/device_loadgen.sh $W/ahead-$threshold-$run 80 40 --min-decodes-to-schedule-ahead $threshold > $W/ahead-$threshold-$run.txt 2>&1; echo "ahead from $threshold ($run) rc=$? ${SECONDS}s"
  grep -v "^  load" $W/ahead-$threshold-$run/loadgen.txt
done; done
