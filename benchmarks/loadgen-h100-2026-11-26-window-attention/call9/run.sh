# Session 10, call 9 (H100): codec fidelity against exact fp32, this tree (window attention kernel) and 4909ac9
# (.devwork/prev); engine in process at 1, 32, 128, 4909ac9 first, then this tree.
W=/tmp/s10c9; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s10c9.tgz -C /tmp s10c9' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
install /tmp/site .whl/site/*.whl
install /tmp/refsite .whl/ref/*.whl
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
PYTHONPATH=/tmp/refsite:$PWD:$PWD/proto:/tmp/site timeout 150 python3 -m benchmarks.codec_fidelity --rows 4 --frames 150 --out $W/codec_fidelity-new.json > $W/fid-new.txt 2>&1; echo "fid new rc=$?"; tail -8 $W/fid-new.txt
(cd .devwork/prev && PYTHONPATH=/tmp/refsite:$PWD:$PWD/proto:/tmp/site timeout 150 python3 -m benchmarks.codec_fidelity --rows 4 --frames 150 --out $W/codec_fidelity-prev.json > $W/fid-prev.txt 2>&1; echo "fid prev rc=$?"; tail -8 $W/fid-prev.txt)
run_engine() {  # NAME DIR
  (cd $2 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 150 python3 -m benchmarks.engine --concurrency 1,32,128 --profile-steps --out $W/engine-$1.json > $W/engine-$1.txt 2>&1; echo "engine-$1 rc=$?")
  grep -A4 "conc " $W/engine-$1.txt; grep "128 phases" $W/engine-$1.txt | sed 's/.*device_prefill_inputs/device_prefill_inputs/' | cut -c1-300
}
run_engine prev $PWD/.devwork/prev
run_engine new $PWD
