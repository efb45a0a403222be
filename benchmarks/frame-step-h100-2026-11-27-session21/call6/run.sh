# Session 21, call 6 (H100): the committed tree (e8f6eb5): the frame-step table, the fidelity step, and the eager
# profile of a frame (kernels and their time) at every batch size of the table, both sizes.
W=/tmp/s21c6; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s21run6.sh $W/run.sh; tar czf $OUT/s21c6.tgz -C /tmp s21c6' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
[ -d /tmp/site ] || install /tmp/site .whl/site/*.whl
[ -d /tmp/refsite ] || install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/proto:/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv; tail -1 $W/gpu.csv; git log --oneline -1 > $W/commit.txt 2>/dev/null
SECONDS=0
timeout 130 python3 -m benchmarks.frame_step --sizes 1.7b,0.6b --batch-sizes 1,2,4,8,32,64,128,256 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame rc=$? ${SECONDS}s"; grep -v -i warn $W/frame_step.txt | tail -17
SECONDS=0; mkdir -p $W/suite
timeout 120 python3 -m benchmarks.suite --out $W/suite --reference-site /tmp/refsite --skip frame_step,engine,reference > $W/suite.txt 2>&1; echo "suite rc=$? ${SECONDS}s"; grep -A9 "^system" $W/suite.txt | tail -9
for size in 0.6b 1.7b; do SECONDS=0
timeout 130 python3 -m benchmarks.profile_step --model random:$size-custom_voice --batch 1,2,4,8,32,64,128,256 --out $W/profile_$size.json > $W/profile_$size.txt 2>&1; echo "profile $size rc=$? ${SECONDS}s"; grep "^batch" $W/profile_$size.txt
done
