"""What crosses between the server's process and the engine core's process, and how.

One Unix socket pair joins them. Each message is a length-prefixed pickle (protocol 5, so audio arrays go
as raw bytes); both ends are processes this package started, so the pickles are trusted. The messages are
small frozen dataclasses. The core batches what it sends: one message per turn of its event loop carries
every stream's new audio and every step's observation since the last one. It also sends a Batch, empty or
not, at a fixed interval: the heartbeat by which the server tells a core that has stopped or stalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import struct
from dataclasses import dataclass, field
from typing import Any

from observability.metrics import StepObservation
from tts_service.engine.engine import EngineOccupancy
from tts_service.engine.model_info import ModelInfo
from tts_service.engine.streams import AudioChunk, SynthesisSummary

_LENGTH = struct.Struct("!Q")


# -- server -> core ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """An engine method whose result (or exception) the server awaits: the core answers with a Reply."""

    call_id: int
    method: str  # one of door.py's CALLS
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Notice:
    """An engine method the server does not wait for (text, abort, pausing a request's output)."""

    method: str  # one of door.py's NOTICES
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Stop:
    """Stop the engine (live requests end with an error; the server drains first) and exit."""


# -- core -> server ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """The engine runs: what the server may know about it."""

    model_info: ModelInfo
    captured_graph_batch_sizes: dict[str, list[int]]
    max_unread_frames: int | None
    occupancy: EngineOccupancy


@dataclass(frozen=True)
class LoadFailed:
    """The model could not be loaded or the engine created; `error` is the exception that said why."""

    error: BaseException


@dataclass(frozen=True)
class Reply:
    call_id: int
    value: Any = None
    error: BaseException | None = None


@dataclass(frozen=True)
class StreamItem:
    """One request stream's next item: audio, its summary, or the exception it ended with."""

    request_id: str
    item: AudioChunk | SynthesisSummary | BaseException


@dataclass(frozen=True)
class Batch:
    """Everything the core produced in one turn of its loop, in order."""

    items: list[StreamItem] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)
    steps: list[StepObservation] = field(default_factory=list)
    occupancy: EngineOccupancy | None = None
    # On the host's monotonic clock, when the runner's thread took up the call that the engine's loop still waits
    # for as this batch goes out; None when it waits for none. A core whose event loop runs on while its step
    # never ends has made no progress since then.
    runner_call_since: float | None = None


def portable(error: BaseException) -> BaseException:
    """`error` if it survives pickling as itself; otherwise a RuntimeError that says what it was."""
    with contextlib.suppress(Exception):  # any failure to round-trip means the stand-in below
        if type(pickle.loads(pickle.dumps(error, protocol=5))) is type(error):
            return error
    return RuntimeError(f"{type(error).__name__}: {error}")


def encode(message: object) -> bytes:
    payload = pickle.dumps(message, protocol=5)
    return _LENGTH.pack(len(payload)) + payload


def send(writer: asyncio.StreamWriter, message: object) -> None:
    writer.write(encode(message))


async def receive(reader: asyncio.StreamReader) -> object:
    """The next message; raises asyncio.IncompleteReadError when the other process has gone."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return pickle.loads(await reader.readexactly(length))
