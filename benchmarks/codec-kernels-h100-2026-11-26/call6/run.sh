# Session 15, call 6 (H100): the working tree (the codebook sum and the one-channel convolution in kernels of their
# own, the decoder blocks' upsampling bias added by the first residual unit's passes) against 2e97079
# (.devwork/prev). The whole GPU suite; the codec alone, both trees; codec fidelity against our decoder in float64
# (.devwork/s15fid.py); the frame graph alone at 96 and 128 rows; the engine at 128 streams, 512 requests, both
# trees alternated twice.
W=/tmp/s15c6; rm -rf $W; mkdir -p $W
trap 'cp .devwork/s15run6.sh $W/run.sh; cp .devwork/s15fid.py $W/; tar czf $OUT/s15c6.tgz -C /tmp s15c6' EXIT
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" "${@:2}"; }
install /tmp/site .whl/site/*.whl
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
SECONDS=0
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 300 python3 -m pytest -q tests/gpu -p no:cacheprovider > $W/gpu_tests.txt 2>&1; echo "gpu tests rc=$? ${SECONDS}s"; tail -1 $W/gpu_tests.txt; grep -E "^(FAILED|ERROR)" $W/gpu_tests.txt | head; grep -E "^E " $W/gpu_tests.txt | head -6 | cut -c1-300
codec() { (cd $1 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 90 python3 -m benchmarks.codec --batch-sizes 1,32,96,128 --chunk-lengths 1 --iterations 20 --profile 128:1 --out $W/codec-$2.json > $W/codec-$2.txt 2>&1; echo "codec $2 rc=$? ${SECONDS}s"; grep -v -i warn $W/codec-$2.txt | grep -v "one stream" | head -7)
}
codec . new
codec .devwork/prev prev
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 120 python3 .devwork/s15fid.py $W/fidelity.json > $W/fidelity.txt 2>&1; echo "fidelity rc=$? ${SECONDS}s"; grep -v -i warn $W/fidelity.txt | tail -4
PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 90 python3 -m benchmarks.frame_step --sizes 1.7b --batch-sizes 96,128 --out $W/frame_step.json > $W/frame_step.txt 2>&1; echo "frame step rc=$? ${SECONDS}s"; tail -3 $W/frame_step.txt
bench() { (cd $1 && PYTHONPATH=$PWD:$PWD/proto:/tmp/site timeout 80 python3 -m benchmarks.engine --profile-steps --out $W/engine-$2.json "${@:3}" > $W/engine-$2.txt 2>&1; echo "engine $2 rc=$? ${SECONDS}s"; grep -v -i warn $W/engine-$2.txt | grep -A9 "conc " | grep -v "first audio")
}
bench . new-512-a --concurrency 128 --requests-per-level 512
bench .devwork/prev prev-512-a --concurrency 128 --requests-per-level 512
bench . new-512-b --concurrency 128 --requests-per-level 512
bench .devwork/prev prev-512-b --concurrency 128 --requests-per-level 512
