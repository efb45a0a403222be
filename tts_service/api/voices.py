"""Registered voices in API terms: request checks, the stored voice as a message, and the statuses of a lookup."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import grpc

from qwen3_tts.v1.protocol import tts_pb2
from tts_service.api.config import InputLimits
from tts_service.api.errors import ApiError, api_error_for, invalid
from tts_service.engine import ModelInfo, RegisteredVoice, VoiceKind, is_voice_id

pb: Any = tts_pb2
_KINDS = {VoiceKind.X_VECTOR: pb.VOICE_KIND_X_VECTOR, VoiceKind.IN_CONTEXT: pb.VOICE_KIND_IN_CONTEXT}
# The VoiceSelection fields that choose a voice some other way; voice_id goes only with `language`.
_OTHER_VOICE_FIELDS = ("speaker", "instruction", "reference_audio", "reference_audio_pcm16_rate", "reference_text",
                       "x_vector_only")


def registered_voice_message(voice: RegisteredVoice) -> Any:
    message = pb.RegisteredVoice(voice_id=voice.voice_id, kind=_KINDS[voice.kind],
                                 reference_seconds=voice.reference_seconds, reference_text=voice.reference_text)
    message.create_time.FromNanoseconds(round(voice.created_at * 1e9))
    return message


def check_voice_id(field: str, voice_id: str) -> None:
    if not voice_id:
        raise invalid(field, "is required")
    if not is_voice_id(voice_id):
        raise invalid(field, "is not a voice id (CreateVoice returns one, e.g. 'voice_' and 24 hex digits)")


def check_voice_selection_by_id(voice: Any, model: ModelInfo) -> None:
    """A VoiceSelection naming a registered voice: nothing else may choose the voice, and the model must clone."""
    check_voice_id("voice.voice_id", voice.voice_id)
    also_set = [f"voice.{name}" for name in _OTHER_VOICE_FIELDS if getattr(voice, name)]
    if also_set:
        raise invalid("voice.voice_id", f"names a registered voice, so {', '.join(also_set)} must not be set")
    if not model.can_clone:
        raise invalid("voice.voice_id", f"the loaded {model.model_type} model cannot clone voices; registered "
                                        "voices need a Base checkpoint")


def check_can_create_voices(model: ModelInfo) -> None:
    if not model.can_clone:
        raise ApiError(grpc.StatusCode.FAILED_PRECONDITION,
                       f"the loaded {model.model_type} model cannot clone voices; CreateVoice needs a server running "
                       "a Base checkpoint")


def check_create_limits(request: Any, limits: InputLimits) -> None:
    if not request.reference_audio:
        raise invalid("reference_audio", "is required: a recording of the voice to clone")
    for field, value, limit, unit in (
            ("reference_text", request.reference_text, limits.reference_text_chars, "characters"),
            ("reference_audio", request.reference_audio, limits.reference_audio_bytes, "bytes")):
        if len(value) > limit:
            raise invalid(field, f"is {len(value)} {unit} long; at most {limit} are accepted")


@contextlib.contextmanager
def fields_at_top_level() -> Iterator[None]:
    """CreateVoiceRequest holds VoiceSelection's reference fields at its top level: the checks it shares with
    synthesis name them as `voice.<field>`, which becomes `<field>` here."""
    try:
        yield
    except Exception as error:
        api_error = api_error_for(error)
        if api_error is None or not api_error.message.startswith("voice."):
            raise
        raise ApiError(api_error.code, api_error.message.removeprefix("voice."), api_error.retry_after_s) from None


def not_found(field: str, voice_id: str) -> ApiError:
    return ApiError(grpc.StatusCode.NOT_FOUND, f"{field}: no voice {voice_id!r}", field=field)
