# Session 16, call 6 (H100): steps scheduled ahead only at capacity (the working tree's default) against at any
# load from 64 decodes (--schedule-ahead-below-capacity, as before): over gRPC at 60 and 80 req/s, 40 s each; then
# in process at 128 streams with 512 requests, at capacity only against never ahead.
W=/tmp/s16c6; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s16run6.sh $W/run.sh; gzip -f $W/*/server.log; tar czf $OUT/s16c6.tgz -C /tmp s16c6' EXIT
SECONDS=0
grpc() { local name=$1; shift
  timeout 175 bash benchmarks/device_loadgen.sh $W/grpc-$name 60,80 40 "$@" > $W/grpc-$name.txt 2>&1; echo "grpc $name rc=$? ${SECONDS}s"
  grep -v "^  load" $W/grpc-$name/loadgen.txt
}
grpc at-capacity
grpc below-capacity --schedule-ahead-below-capacity
export PYTHONPATH=$PWD:$PWD/proto:/tmp/site
bench() { local name=$1; shift
  timeout 100 python3 -m benchmarks.engine --profile-steps --concurrency 128 --requests-per-level 512 --out $W/engine-$name.json "$@" > $W/engine-$name.txt 2>&1; echo "engine $name rc=$? ${SECONDS}s"
  grep -v -i warn $W/engine-$name.txt | grep -A2 "conc " | cut -c1-200
}
bench at-capacity
bench in-order --min-decodes-to-schedule-ahead off
