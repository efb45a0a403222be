# Session 10, call 2 (H100): the codec per call with cuDNN's heuristics against cudnn.benchmark (autotuned at
# capture); the engine with the codec's stream the more urgent one (.devwork/flip).
W=/tmp/s10c2; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s10c2.tgz -C /tmp s10c2' EXIT
source benchmarks/device_server.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
CODEC="--batch-sizes 1,32,64,128 --chunk-lengths 1 --iterations 20 --profile 128:1"
/usr/bin/time -f "wall %e s" timeout 120 python3 -m benchmarks.codec $CODEC --out $W/codec-heur.json > $W/codec-heur.txt 2>&1; echo "codec-heur rc=$?"
/usr/bin/time -f "wall %e s" timeout 200 python3 -c "
import runpy, sys, torch
torch.backends.cudnn.benchmark = True
sys.argv = ['codec'] + sys.argv[1:]
runpy.run_module('benchmarks.codec', run_name='__main__')" $CODEC --out $W/codec-tuned.json > $W/codec-tuned.txt 2>&1; echo "codec-tuned rc=$?"
grep -v -i warn $W/codec-heur.txt | head -12; grep -v -i warn $W/codec-tuned.txt | head -12
(cd .devwork/flip && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 140 python3 -m benchmarks.engine --concurrency 1,32,128 --profile-steps --out $W/engine-flip.json > $W/engine-flip.txt 2>&1; echo "engine-flip rc=$?")
grep -A4 "conc " $W/engine-flip.txt; grep phases $W/engine-flip.txt | cut -c1-260
