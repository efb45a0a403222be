# Session 11, call 10 (H100): the frame step under each cuBLAS front end (torch.backends.cuda.preferred_blas_library),
# cublasLt (PyTorch's default) before and after cublas.
W=/tmp/s11c10; rm -rf $W; mkdir -p $W
trap 'tar czf $OUT/s11c10.tgz -C /tmp s11c10' EXIT
source benchmarks/device_server.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $W/gpu.csv
for run in 1-cublaslt 2-cublas 3-cublaslt; do
  timeout 100 python3 .devwork/blas_library.py ${run#*-} $W/frame_step-$run.json > $W/frame_step-$run.txt 2>&1; echo "$run rc=$?"; grep -v -i warn $W/frame_step-$run.txt | tail -8
done
