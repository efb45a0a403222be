# Session 11, call 7 (H100): the projections' weight layouts through cuBLAS (cold L2); the engine in process at
# 1, 32, 128 for the session's start (4074296, .devwork/start) and this tree (daedbc3), on one machine.
W=/tmp/s11c7; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s11c7.tgz -C /tmp s11c7' EXIT
source benchmarks/device_server.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 150 python3 -m benchmarks.projection_layouts --out $W/projection_layouts.json > $W/projection_layouts.txt 2>&1; echo "layouts rc=$?"; grep -v -i warn $W/projection_layouts.txt
run_engine() {  # NAME DIR
  (cd $2 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 120 python3 -m benchmarks.engine --concurrency 1,32,128 --profile-steps --out $W/engine-$1.json > $W/engine-$1.txt 2>&1; echo "engine-$1 rc=$?")
  grep -A4 "conc " $W/engine-$1.txt
}
run_engine new $PWD
run_engine start $PWD/.devwork/start
