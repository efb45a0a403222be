# Session 21, call 8 (H100): the service over gRPC, side by side on one machine: the session's start (8d723a0,
# .devwork/old) and the tree (e8f6eb5), 20 and 40 req/s for 30 s each, then the session's start again.
set -u
ln -sfn $PWD/.whl .devwork/old/.whl
run() { mkdir -p $OUT/$2; (cd $1 && bash benchmarks/device_loadgen.sh $OUT/$2 20,40 30 > $OUT/$2/run.txt 2>&1); echo "$2 rc=$?"; grep -v -i warn $OUT/$2/run.txt | grep -A1 "^  load" | grep -v "^--" | grep -v "^  load"; rm -f $OUT/$2/server.log $OUT/$2/metrics.txt $OUT/$2/*.json.gz $OUT/$2/loadgen.txt; }
run .devwork/old old1
run . new
run .devwork/old old2
