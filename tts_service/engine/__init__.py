"""The engine: the only door below the API.

`Engine.create(model, EngineConfig(...))` (or `Engine.load(source, device, config)`) loads the runner
(KV memory, graphs) and a scheduler sized from it; `start()` runs its loop. The front doors use what
this package exports and nothing below it: submit a `SynthesisRequest` and read its `RequestStream`,
feed open text with `append_text` / `close_text`, `abort`, `clone_voice`, keep registered voices with
`create_voice` / `registered_voice` / `registered_voices` / `delete_voice`, time words with
`align_words` (with `--aligner-model`), and read `model_info`, `stats` and `occupancy()`.

The names are resolved on first use, so that `tts_service.engine.config` (which the server's flags
need) can be imported without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AlignmentItem": "tts_service.model.aligner",
    "AudioChunk": "tts_service.engine.streams",
    "CheckpointError": "tts_service.model.checkpoint",
    "CoreSpec": "tts_service.engine.core_process",
    "Engine": "tts_service.engine.engine",
    "EngineConfig": "tts_service.engine.config",
    "EngineCores": "tts_service.engine.cores",
    "EngineCoreExited": "tts_service.engine.engine_process",
    "EngineCoreLost": "tts_service.engine.engine_process",
    "EngineDoor": "tts_service.engine.door",
    "EngineOccupancy": "tts_service.engine.engine",
    "EngineProcess": "tts_service.engine.engine_process",
    "EngineStats": "tts_service.engine.engine",
    "EngineStoppedError": "tts_service.engine.engine",
    "FinishReason": "scheduler.request",
    "GenerationParams": "tts_service.runner.params",
    "ModelInfo": "tts_service.engine.model_info",
    "PromptError": "tts_service.model.prompts",
    "QueueFullError": "scheduler.scheduler",
    "RegisteredVoice": "tts_service.engine.voice_files",
    "RequestFailed": "tts_service.engine.streams",
    "RequestStream": "tts_service.engine.streams",
    "RequestTooLargeError": "scheduler.scheduler",
    "SamplingParams": "tts_service.runner.params",
    "SynthesisInput": "tts_service.model.prompts",
    "SynthesisRequest": "tts_service.engine.streams",
    "SynthesisSummary": "tts_service.engine.streams",
    "VoiceClone": "tts_service.model.prompts",
    "VoiceKind": "tts_service.engine.voice_files",
    "VoiceNotFoundError": "tts_service.engine.voice_store",
    "VoiceStoreFullError": "tts_service.engine.voice_store",
    "VoiceStoreUnusableError": "tts_service.engine.voice_store",
    "WordTiming": "tts_service.model.aligner",
    "is_voice_id": "tts_service.engine.voice_store",
}

__all__ = [
    "AlignmentItem",
    "AudioChunk",
    "CheckpointError",
    "CoreSpec",
    "Engine",
    "EngineConfig",
    "EngineCoreExited",
    "EngineCoreLost",
    "EngineCores",
    "EngineDoor",
    "EngineOccupancy",
    "EngineProcess",
    "EngineStats",
    "EngineStoppedError",
    "FinishReason",
    "GenerationParams",
    "ModelInfo",
    "PromptError",
    "QueueFullError",
    "RegisteredVoice",
    "RequestFailed",
    "RequestStream",
    "RequestTooLargeError",
    "SamplingParams",
    "SynthesisInput",
    "SynthesisRequest",
    "SynthesisSummary",
    "VoiceClone",
    "VoiceKind",
    "VoiceNotFoundError",
    "VoiceStoreFullError",
    "VoiceStoreUnusableError",
    "WordTiming",
    "is_voice_id",
]

if TYPE_CHECKING:
    from scheduler.request import FinishReason
    from scheduler.scheduler import QueueFullError, RequestTooLargeError
    from tts_service.engine.config import EngineConfig
    from tts_service.engine.core_process import CoreSpec
    from tts_service.engine.cores import EngineCores
    from tts_service.engine.door import EngineDoor
    from tts_service.engine.engine import Engine, EngineOccupancy, EngineStats, EngineStoppedError
    from tts_service.engine.engine_process import EngineCoreExited, EngineCoreLost, EngineProcess
    from tts_service.engine.model_info import ModelInfo
    from tts_service.engine.streams import (
        AudioChunk,
        RequestFailed,
        RequestStream,
        SynthesisRequest,
        SynthesisSummary,
    )
    from tts_service.engine.voice_files import RegisteredVoice, VoiceKind
    from tts_service.engine.voice_store import (
        VoiceNotFoundError,
        VoiceStoreFullError,
        VoiceStoreUnusableError,
        is_voice_id,
    )
    from tts_service.model.aligner import AlignmentItem, WordTiming
    from tts_service.model.checkpoint import CheckpointError
    from tts_service.model.prompts import PromptError, SynthesisInput, VoiceClone
    from tts_service.runner.params import GenerationParams, SamplingParams


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
