# Session 11, call 2 (H100): the sampling kernel makes each row's Gumbel noise itself. GPU tests; the frame step
# (1.7B and 0.6B) for this tree and 4074296 (.devwork/prev); the batch-1 profile; the fidelity suite step; the
# engine in process at 1, 32, 128 for this tree.
W=/tmp/s11c2; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s11c2.tgz -C /tmp s11c2' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
install /tmp/site .whl/site/*.whl
install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
timeout 170 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$?"; tail -2 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -20
FRAME="--sizes 1.7b,0.6b --batch-sizes 1,64,128"
timeout 100 python3 -m benchmarks.frame_step $FRAME --out $W/frame_step-new.json > $W/frame_step-new.txt 2>&1; echo "frame new rc=$?"
(cd .devwork/prev && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 100 python3 -m benchmarks.frame_step $FRAME --out $W/frame_step-prev.json > $W/frame_step-prev.txt 2>&1; echo "frame prev rc=$?")
grep -v -i warn $W/frame_step-new.txt | tail -7; grep -v -i warn $W/frame_step-prev.txt | tail -7
timeout 60 python3 -m benchmarks.profile_step --batch 1,64 --out $W/profile.json > $W/profile.txt 2>&1; echo "profile rc=$?"; grep -i "kernels" $W/profile.txt | head -4
mkdir -p $W/suite
timeout 150 python3 -m benchmarks.suite --out $W/suite --reference-site /tmp/refsite --skip frame_step,engine,reference > $W/suite.txt 2>&1; echo "suite rc=$?"; tail -15 $W/suite.txt
timeout 120 python3 -m benchmarks.engine --concurrency 1,32,128 --profile-steps --out $W/engine-new.json > $W/engine-new.txt 2>&1; echo "engine-new rc=$?"
grep -A4 "conc " $W/engine-new.txt
