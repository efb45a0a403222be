"""The engine's door as the front doors see it, whichever process the engine core runs in: `Engine` in this
process, or `EngineProcess` before a core of its own. The API is written against this and nothing else.

The door is declared here once. `EngineCalls` and `EngineNotices` are the operations that cross to a core in a
process of its own, by name: the core answers each call, and nobody waits for a notice. `CALLS` and `NOTICES`
are their names, read from those declarations; the core's bridge dispatches exactly these, and `EngineProcess`
sends an operation only through `declared_name`, which refuses anything else in the sending process rather than
leaving the core to fail on a name it does not know. `EngineProcess` answers the rest of `EngineDoor` itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from observability.metrics import StepObservation
from tts_service.engine.engine import EngineOccupancy
from tts_service.engine.model_info import ModelInfo
from tts_service.engine.streams import RequestStream, SynthesisRequest
from tts_service.engine.voice_files import RegisteredVoice
from tts_service.model.aligner import AlignmentItem, WordTiming
from tts_service.model.prompts import VoiceClone


class EngineCalls(Protocol):
    """The door's operations whose result (or exception) the caller awaits."""

    async def submit(self, request: SynthesisRequest) -> RequestStream: ...
    async def clone_voice(self, wav_24k: np.ndarray, reference_text: str | None,
                          x_vector_only: bool) -> VoiceClone: ...
    async def create_voice(self, wav_24k: np.ndarray, reference_text: str | None, x_vector_only: bool,
                           owner: str) -> RegisteredVoice: ...
    async def registered_voice(self, voice_id: str, owner: str) -> RegisteredVoice: ...
    async def registered_voices(self, owner: str) -> list[RegisteredVoice]: ...
    async def delete_voice(self, voice_id: str, owner: str) -> None: ...
    async def align_words(self, item: AlignmentItem) -> list[WordTiming]: ...


class EngineNotices(Protocol):
    """The door's operations that nobody waits for: what follows from them reaches the request's stream."""

    def append_text(self, request_id: str, fragment: str) -> None: ...
    def close_text(self, request_id: str) -> None: ...
    def abort(self, request_id: str) -> None: ...
    # The request's stream calls this when its reader falls behind or catches up; the API has no need to.
    def set_output_paused(self, request_id: str, is_paused: bool) -> None: ...


class EngineDoor(EngineCalls, EngineNotices, Protocol):
    model_info: ModelInfo

    @property
    def is_running(self) -> bool: ...
    @property
    def num_cores_running(self) -> int: ...
    def occupancy(self) -> EngineOccupancy: ...
    def captured_graph_batch_sizes(self) -> dict[str, list[int]]: ...
    def add_step_observer(self, observer: Callable[[StepObservation], None]) -> None: ...
    def deadline_in(self, seconds: float) -> float: ...
    async def warm_up(self) -> bool: ...
    async def wait_exited(self) -> None: ...
    async def wait_cores_changed(self, num_running_seen: int) -> bool: ...
    async def stop(self) -> None: ...


def bound_operations(engine: object, names: frozenset[str], *, awaited: bool) -> dict[str, Callable[..., Any]]:
    """`engine`'s operations by name, each checked to exist and to be of its kind (a coroutine function when
    `awaited`, a plain one otherwise). Raises TypeError for the first that is not."""
    return {name: _operation(engine, name, awaited=awaited) for name in names}


def declared_name(operation: Callable[..., object], protocol: type) -> str:
    """The name by which `operation`, as `protocol` declares it, crosses to the core. Raises ValueError for
    anything else, so that an undeclared operation fails where it is sent, not in the core."""
    name = getattr(operation, "__name__", "")
    if vars(protocol).get(name) is not operation:
        raise ValueError(f"{operation!r} is not an operation {protocol.__name__} declares")
    return name


def _operation(owner: object, name: str, *, awaited: bool) -> Callable[..., Any]:
    operation = getattr(owner, name, None)
    if not callable(operation) or inspect.iscoroutinefunction(operation) is not awaited:
        kind = "a coroutine function" if awaited else "a plain function"
        raise TypeError(f"the engine operation {name!r} of {owner!r} must be {kind}, not {operation!r}")
    return operation


def _declared_operations(protocol: type, *, awaited: bool) -> frozenset[str]:
    """The operations `protocol` declares in its own body; one of the wrong kind fails the import."""
    names = frozenset(name for name, value in vars(protocol).items()
                      if inspect.isfunction(value) and not name.startswith("_"))
    bound_operations(protocol, names, awaited=awaited)
    return names


CALLS: frozenset[str] = _declared_operations(EngineCalls, awaited=True)
NOTICES: frozenset[str] = _declared_operations(EngineNotices, awaited=False)
