"""The generated protobuf and gRPC modules of qwen3_tts/v1/tts.proto, shared by the client and the server.

The Python code is generated from the .proto when this module is first imported (grpcio-tools'
`grpc.protos_and_services`), so no generated file is committed and the .proto stays the single
source of truth. It lives beside the .proto in the `qwen3_tts.v1` package, so that the server and every client import
one module: in a checkout that directory is `proto/qwen3_tts/v1`, in an installed wheel it is package
data in site-packages.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import grpc

PROTO_FILE = "qwen3_tts/v1/tts.proto"
SERVICE_NAME = "qwen3_tts.v1.TextToSpeech"


def find_proto_root() -> Path:
    """The directory that holds qwen3_tts/v1/tts.proto: the one this package sits in."""
    root = Path(__file__).resolve().parents[2]
    if not (root / PROTO_FILE).is_file():
        raise FileNotFoundError(f"{PROTO_FILE} is missing from {root}; reinstall the package")
    return root


def _load() -> tuple[Any, Any]:
    root = str(find_proto_root())
    # grpc's importer resolves the .proto (and the generated module names) against sys.path.
    if root not in sys.path:
        sys.path.append(root)
    return grpc.protos_and_services(PROTO_FILE)


tts_pb2, tts_pb2_grpc = _load()
