# The Qwen3-TTS gRPC server on CUDA.
#   docker build -t qwen3-tts-service .
#   docker run --gpus all -p 50051:50051 -p 8000:8000 -p 9090:9090 -v qwen3-tts-models:/models qwen3-tts-service \
#       --model Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice --http-port 8000
#
# torch from PyPI is a CUDA 13.0 build (NVIDIA driver R580 or newer). For older drivers, build a
# CUDA 12.8 image from the PyTorch index (driver R570 or newer), with a torch release that has cu128 wheels:
#   docker build --build-arg CUDA_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04 \
#       --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 --build-arg TORCH_VERSION=<version> .
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-base-ubuntu24.04
# The "base" flavour: the torch wheels bring their own cuBLAS, cuDNN and NCCL, so the "runtime"
# flavour's copies would only add gigabytes; the image keeps the NVIDIA container toolkit's
# settings and its check that the node's driver is new enough.
FROM ${CUDA_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://pypi.org/simple

LABEL org.opencontainers.image.title="qwen3-tts-service" \
      org.opencontainers.image.description="gRPC streaming text-to-speech for the Qwen3-TTS 12 Hz models" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# libsndfile (with libopus) for the audio encoders. gcc, libc headers and Python.h because Triton
# compiles a small C launcher for its kernels on first use, at run time. The venv keeps pip away
# from the system Python.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev gcc libc6-dev libsndfile1 libopus0 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "$VIRTUAL_ENV"

WORKDIR /opt/qwen3-tts
# torch (a CUDA build) in its own layer, so that a source change does not download it again.
RUN pip install --index-url "$TORCH_INDEX" "torch==${TORCH_VERSION}"
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY tts_service ./tts_service
COPY scheduler ./scheduler
COPY observability ./observability
COPY clients ./clients
# Not editable: the packages (and their byte code, compiled here) live in the read-only venv.
RUN pip install . \
    && qwen3-tts-server --help > /dev/null

# A non-root user; the model cache (HF_HOME) is a volume, and everything else the server writes
# (Triton's and CUDA's caches under HOME) goes to /tmp, so the root filesystem can be read-only.
RUN useradd --uid 10001 --create-home --home-dir /home/tts tts \
    && mkdir -p /models && chown tts:tts /models
ENV HF_HOME=/models/huggingface \
    HOME=/tmp \
    TRITON_CACHE_DIR=/tmp/triton \
    QWEN3_TTS_PORT=50051 \
    QWEN3_TTS_METRICS_PORT=9090
VOLUME ["/models"]
USER 10001
# gRPC (with grpc.health.v1 for probes) and Prometheus metrics. No HEALTHCHECK: Kubernetes uses its
# native gRPC probes, and Docker's would need a client in the image that speaks the server's TLS.
EXPOSE 50051 9090

ENTRYPOINT ["qwen3-tts-server"]
