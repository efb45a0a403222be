#!/usr/bin/env bash
# Fetches, on a machine with PyPI, the wheels that the GPU machine lacks (it has torch, triton,
# transformers 5.x, grpcio, protobuf and prometheus-client, but no network), into .whl/ (git-ignored):
#     bash benchmarks/fetch_wheels.sh [GROUP ...]      # default: every group
# Groups, each a folder that benchmarks/device_*.sh installs with --no-deps:
#   site  what the service imports that the machine lacks: audio (soundfile, cffi, pycparser, soxr, lameenc), and
#         aiohttp with its needs (the metrics endpoint)
#   grpc  grpcio-tools and the health, reflection and status services, with the protobuf they were built against
#   otel  the OpenTelemetry SDK and its OTLP/gRPC exporter
#   ref   qwen-tts 0.1.1 with the transformers it pins and librosa's stack (reference and fidelity benchmarks),
#         less numba, llvmlite and scikit-learn: the GPU machine has them, and with them the group is over the
#         64 MiB a device call may carry
# The GPU machine runs CPython 3.12 on x86-64 Linux.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A WHEELS=(
    [site]="soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 soxr==1.1.0 lameenc==1.9.0 aiohttp==3.14.5
            aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 multidict==7.2.1 propcache==0.5.4 yarl==1.25.1"
    [grpc]="grpcio==1.85.1 grpcio-tools==1.85.1 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1
            grpcio-status==1.85.1 protobuf==7.36.2 googleapis-common-protos==1.76.0"
    [otel]="opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2
            opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-proto-grpc==1.45.2
            opentelemetry-semantic-conventions==0.66b2"
    [ref]="qwen-tts==0.1.1 transformers==4.57.3 huggingface_hub==0.36.2 tokenizers==0.22.2 accelerate==1.12.0
           einops==0.8.2 librosa==0.11.0 audioread==3.1.0 decorator==5.3.1 lazy-loader==0.6 pooch==1.9.0
           platformdirs==4.14.7 soxr==1.1.0 soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 msgpack==1.2.4
           joblib==1.6.0 threadpoolctl==3.8.0"
)
platforms=()
for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)

for group in "${@:-site grpc otel ref}"; do
    for name in $group; do
        # shellcheck disable=SC2086
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            "${platforms[@]}" -d ".whl/$name" ${WHEELS[$name]}
    done
done
