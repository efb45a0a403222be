"""The frame step with each cuBLAS front end PyTorch offers (cublasLt, its default on CUDA, and cublas)."""
import sys, torch
from benchmarks import frame_step
library = sys.argv[1]
torch.backends.cuda.preferred_blas_library(library)
print("blas library:", torch.backends.cuda.preferred_blas_library())
frame_step.main(["--sizes", "1.7b,0.6b", "--batch-sizes", "1,8,64", "--out", sys.argv[2]])
