"""The generated protobuf and gRPC modules of qwen3_tts/v1/tts.proto, shared by the client and the server.

The Python code is generated from the .proto when this module is first imported (grpcio-tools'
`grpc.protos_and_services`), so no generated file is committed and the .proto stays the single
source of truth. The .proto is found in the checkout (`proto/` at the repository root, which an
editable install also uses) or, in an installed wheel, as package data in site-packages.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import grpc

PROTO_FILE = "qwen3_tts/v1/tts.proto"
SERVICE_NAME = "qwen3_tts.v1.TextToSpeech"


def find_proto_root() -> Path:
    """The directory that holds qwen3_tts/v1/tts.proto."""
    checkout = Path(__file__).resolve().parents[2] / "proto"
    for root in (checkout, *(Path(entry) for entry in sys.path if entry)):
        if (root / PROTO_FILE).is_file():
            return root
    raise FileNotFoundError(f"{PROTO_FILE} is neither in {checkout} nor on sys.path; reinstall the package")


def _load() -> tuple[Any, Any]:
    root = str(find_proto_root())
    # grpc's importer resolves the .proto (and the generated module names) against sys.path.
    if root not in sys.path:
        sys.path.append(root)
    return grpc.protos_and_services(PROTO_FILE)


tts_pb2, tts_pb2_grpc = _load()
