# Session 14, call 5 (H100, call 4's machine): the eager prefill's last-position index uploaded without a blocking
# copy; the runner GPU tests.
W=/tmp/s14c5; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s14run5.sh $W/run.sh; tar czf $OUT/s14c5.tgz -C /tmp s14c5' EXIT
SECONDS=0
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 120 python3 -m pytest -q tests/gpu/test_runner_cuda.py -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E |runner.py:[0-9]+: in" $W/gpu_tests.txt | head -8 | cut -c1-300
