"""A registered voice as bytes and back: one safetensors file holding the speaker embedding, the reference codes of
an in-context voice, and the voice's description as the file's string metadata.

Decoding checks everything a served voice relies on (format, id, owner, kind, tensor shapes against the loaded
model), so that a damaged or foreign file is refused here and never reaches a request.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import struct
from dataclasses import dataclass

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from tts_service.model.prompts import VoiceClone

_FORMAT = "qwen3-tts-voice/1"
_EMBEDDING = "speaker_embedding"
_CODES = "reference_codes"
_HEADER_LENGTH_BYTES = 8


class VoiceKind(enum.Enum):
    X_VECTOR = "x_vector"  # the speaker embedding alone
    IN_CONTEXT = "in_context"  # also the reference's codes and transcript


@dataclass(frozen=True)
class RegisteredVoice:
    """A stored voice: its description and the clone that synthesis uses in place of reference audio."""

    voice_id: str
    owner: str  # a digest of the API key that created it; "" when the server has no keys
    kind: VoiceKind
    reference_seconds: float
    reference_text: str
    created_at: float  # Unix time
    clone: VoiceClone


@dataclass(frozen=True)
class VoiceShape:
    """What a voice must look like to be served by the loaded model."""

    embedding_size: int
    num_code_groups: int
    device: torch.device


class CorruptVoiceError(ValueError):
    """A stored voice that cannot be served; the message says why."""


def encode_voice(voice: RegisteredVoice) -> bytes:
    embedding = voice.clone.speaker_embedding
    assert isinstance(embedding, torch.Tensor)
    tensors = {_EMBEDDING: embedding.detach().to("cpu").contiguous()}
    if voice.clone.reference_codes is not None:
        tensors[_CODES] = torch.tensor(voice.clone.reference_codes, dtype=torch.int32)
    metadata = {"format": _FORMAT, "voice_id": voice.voice_id, "owner": voice.owner, "kind": voice.kind.value,
                "reference_seconds": repr(voice.reference_seconds), "reference_text": voice.reference_text,
                "created_at": repr(voice.created_at), "sha256": _digest(tensors)}
    return save_tensors(tensors, metadata)


def decode_voice(data: bytes, voice_id: str, shape: VoiceShape) -> RegisteredVoice:
    """The voice stored as `data` under `voice_id`; CorruptVoiceError when it is not a whole, valid voice of this
    model."""
    metadata = _metadata(data)
    try:
        tensors = load_tensors(data)  # also checks that the data covers every tensor: a cut file fails here
    except SafetensorError as error:
        raise CorruptVoiceError(f"not a whole safetensors file: {error}") from None
    _require(metadata.get("format") == _FORMAT, f"format {metadata.get('format')!r}, expected {_FORMAT!r}")
    _require(metadata.get("voice_id") == voice_id, f"holds voice {metadata.get('voice_id')!r}, not {voice_id!r}")
    # safetensors checks the layout, not the numbers: a flipped bit in a tensor shows only here.
    _require(metadata.get("sha256") == _digest(tensors), "its tensors do not match their checksum")
    try:
        kind = VoiceKind(metadata.get("kind"))
        reference_seconds = float(metadata["reference_seconds"])
        created_at = float(metadata["created_at"])
        owner, reference_text = metadata["owner"], metadata["reference_text"]
    except (KeyError, ValueError) as error:
        raise CorruptVoiceError(f"bad metadata: {error}") from None
    _require(math.isfinite(reference_seconds) and math.isfinite(created_at), "non-finite numbers in its metadata")
    embedding = tensors.get(_EMBEDDING)
    _require(embedding is not None and tuple(embedding.shape) == (shape.embedding_size,),
             f"its speaker embedding does not fit this model's ({shape.embedding_size} values)")
    codes = _reference_codes(tensors.get(_CODES), kind, shape.num_code_groups)
    assert embedding is not None
    clone = VoiceClone(speaker_embedding=embedding.to(shape.device), reference_codes=codes,
                       reference_text=reference_text if kind is VoiceKind.IN_CONTEXT else None)
    return RegisteredVoice(voice_id, owner, kind, reference_seconds, reference_text, created_at, clone)


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _metadata(data: bytes) -> dict[str, str]:
    """The file's string metadata, read from its JSON header."""
    if len(data) < _HEADER_LENGTH_BYTES:
        raise CorruptVoiceError("shorter than a safetensors header")
    (length,) = struct.unpack("<Q", data[:_HEADER_LENGTH_BYTES])
    try:
        header = json.loads(data[_HEADER_LENGTH_BYTES:_HEADER_LENGTH_BYTES + length])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CorruptVoiceError("its header is not JSON") from None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict):
        raise CorruptVoiceError("its header has no metadata")
    return metadata


def _reference_codes(codes: torch.Tensor | None, kind: VoiceKind,
                     num_code_groups: int) -> tuple[tuple[int, ...], ...] | None:
    if kind is VoiceKind.X_VECTOR:
        _require(codes is None, "an x-vector voice with reference codes")
        return None
    _require(codes is not None and codes.dim() == 2 and codes.shape[0] > 0 and codes.shape[1] == num_code_groups,
             f"its reference codes are not frames of this model's {num_code_groups} codebooks")
    assert codes is not None
    return tuple(tuple(frame) for frame in codes.tolist())


def _require(condition: bool, reason: str) -> None:
    if not condition:
        raise CorruptVoiceError(reason)
