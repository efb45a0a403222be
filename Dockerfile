# The Qwen3-TTS gRPC server on a CUDA runtime.
#   docker build -t qwen3-tts-service .
#   docker run --gpus all -p 50051:50051 -p 9090:9090 -v qwen3-tts-models:/models qwen3-tts-service \
#       --model Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# libsndfile and libopus for the audio encoders; the venv keeps pip away from the system Python.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv libsndfile1 libopus0 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "$VIRTUAL_ENV"

WORKDIR /opt/qwen3-tts
# torch (CUDA build) in its own layer, so that a source change does not download it again.
RUN pip install --index-url "$TORCH_INDEX" "torch==${TORCH_VERSION}"
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY tts_service ./tts_service
COPY scheduler ./scheduler
COPY observability ./observability
COPY clients ./clients
RUN pip install .

# A non-root user; the model cache (HF_HOME) is a volume, and everything else it writes goes to /tmp,
# so the root filesystem can be mounted read-only.
RUN useradd --uid 10001 --create-home --home-dir /home/tts tts \
    && mkdir -p /models && chown tts:tts /models
ENV HF_HOME=/models/huggingface \
    HOME=/tmp \
    TRITON_CACHE_DIR=/tmp/triton \
    QWEN3_TTS_PORT=50051 \
    QWEN3_TTS_METRICS_PORT=9090
VOLUME ["/models"]
USER 10001
EXPOSE 50051 9090

ENTRYPOINT ["qwen3-tts-server"]
