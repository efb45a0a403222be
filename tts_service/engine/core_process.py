"""The engine core's process: it owns the GPU and loops schedule -> execute -> update, and nothing else.

The gRPC front door, audio encoding and protobuf stay in the server's process, so that they never hold this
process's GIL while the runner queues a step. Under load they did: at 30 req/s on an H100 the split took 2.5 ms of
host time off every step, and the service's ceiling over gRPC rose from about 155 to 244 audio seconds per second
(BENCHMARKS.md). The server's process starts this one with `EngineProcess.start` (engine_process.py); what
crosses between them is in wire.py, and which of the engine's operations cross, by name, is declared once in door.py.

The core ends when the server says Stop, or when its socket closes because the server's process has gone. It
beats (an empty Batch) a few times within the server's stall timeout, so that the server can tell a core that
is silent because it has stopped from one with nothing to say.

A core may serve several front doors, one socket each (`EngineProcess.start(..., num_further_doors=N)`), so that
more than one process can carry a GPU's calls. The first is the core's owner: its Stop or its going ends the core,
and the engine's step observations go to it alone. Another's going ends only its own requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from observability.gc_pauses import freeze_startup_objects, thaw_startup_objects, watch_pauses
from observability.logs import configure_logging
from observability.metrics import StepObservation
from tts_service.engine.config import EngineConfig
from tts_service.engine.door import CALLS, NOTICES, EngineCalls, EngineNotices, bound_operations
from tts_service.engine.engine import Engine
from tts_service.engine.streams import AudioChunk, RequestStream, SynthesisRequest, SynthesisSummary
from tts_service.engine.voice_files import RegisteredVoice
from tts_service.engine.wire import (
    Batch,
    Call,
    LoadFailed,
    Notice,
    Ready,
    Reply,
    Stop,
    StreamItem,
    portable,
    receive,
    send,
)
from tts_service.model.prompts import VoiceClone

logger = logging.getLogger(__name__)

# Beats within the server's stall timeout: one late beat, or two, never reads as a stall.
_BEATS_PER_STALL_TIMEOUT = 4
# The signal by which the server asks a core for every thread's stack (see run_core).
STACKS_SIGNAL = signal.SIGUSR1

# The bridge answers a submit itself: it converts the request from the wire and holds the notices sent meanwhile.
_SUBMIT = EngineCalls.submit.__name__


@dataclass(frozen=True)
class CoreSpec:
    """What the core's process needs to load and run the engine."""

    model: str
    device: str
    engine: EngineConfig
    log_level: str
    log_format: str
    gil_switch_interval_s: float
    # How long the server waits for progress from the core while it holds requests or calls for it.
    stall_timeout_s: float


NewStream = Callable[[str], RequestStream]


def load_engine(spec: CoreSpec, new_stream: NewStream) -> Engine:
    return Engine.load(spec.model, spec.device, spec.engine, new_stream=new_stream)


def run_core(spec: CoreSpec, channels: Sequence[socket.socket],
             load: Callable[[CoreSpec, NewStream], Engine] = load_engine) -> None:
    """The process's entry point (spawned, so that CUDA starts fresh in it), serving a front door on each of
    `channels`, its owner's first. `load` makes the engine it serves (the front door's benchmark serves a stand-in
    that paces frames without a model: benchmarks/paced_core.py)."""
    configure_logging(spec.log_level, spec.log_format)
    device = only_device_visible(spec.device)
    if device != spec.device:
        logger.info("the engine core on %s sees only that GPU (CUDA_VISIBLE_DEVICES=%s), as %s", spec.device,
                    os.environ["CUDA_VISIBLE_DEVICES"], device)
        spec = replace(spec, device=device)
    sys.setswitchinterval(spec.gil_switch_interval_s)
    # A terminal's Ctrl-C, or a SIGTERM sent to the whole process group, would cut the streams the server is
    # draining: the server's process alone decides when the core stops (and kills it if it does not).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Where every thread is, written to stderr (the server's log) when the server is about to kill the core for a
    # stall: a stuck step then names the call it is stuck in. faulthandler writes it without the GIL, which a stuck
    # thread may hold.
    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)
    asyncio.run(_serve(spec, channels, load))


def only_device_visible(device: str) -> str:
    """The core's device as the core's process will name it, once only that GPU is visible to the process: `cuda:N`
    becomes `cuda:0` with CUDA_VISIBLE_DEVICES narrowed to the N-th of those the server saw. CUDA starts every thread
    on device 0, and an event recorded or a kernel launched without naming a device goes to the thread's device: a
    core on another GPU would wait on events that stand for nothing there (the engine's copies of frames to the host,
    the uploads of prompt ids) and read buffers not yet written. With one GPU visible, device 0 is the core's in
    every thread (the engine's, the aligner's, asyncio's workers). Once CUDA has started in the process the GPUs it
    sees are fixed, and the device is left as it is."""
    kind, _, index = device.partition(":")
    if kind != "cuda" or not index or torch.cuda.is_initialized():
        return device
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [entry.strip() for entry in visible.split(",")] if visible else None
    if ids is not None and int(index) >= len(ids):
        raise ValueError(f"device {device}: CUDA_VISIBLE_DEVICES={visible} makes only {len(ids)} GPU(s) visible")
    os.environ["CUDA_VISIBLE_DEVICES"] = index if ids is None else ids[int(index)]
    return "cuda:0"


class ForwardingStream(RequestStream):
    """A request stream whose items go straight to the server's process; the stream there, which its caller
    reads, counts the unread audio and asks for the pause."""

    def __init__(self, request_id: str, forward: Callable[[StreamItem], None]) -> None:
        super().__init__(request_id)
        self._forward = forward

    def _put(self, item: AudioChunk | SynthesisSummary | Exception) -> None:
        self._forward(StreamItem(self.request_id, portable(item) if isinstance(item, BaseException) else item))


class StreamRouter:
    """Sends each request's stream items to the front door that submitted it, and knows which requests each door
    still has in the engine. Front doors name requests with random UUIDs, so ids never meet across doors (and the
    engine refuses one already in use, from whichever door)."""

    def __init__(self, outboxes: Sequence[Outbox]) -> None:
        self._outboxes = outboxes
        self._door_of: dict[str, int] = {}

    def new_stream(self, request_id: str) -> RequestStream:
        return ForwardingStream(request_id, self._forward)

    def admit(self, door: int, request_id: str) -> None:
        self._door_of.setdefault(request_id, door)

    def release(self, door: int, request_id: str) -> None:
        """A request the engine refused: it never had a stream."""
        if self._door_of.get(request_id) == door:
            del self._door_of[request_id]

    def live_request_ids(self, door: int) -> list[str]:
        return [request_id for request_id, owner in self._door_of.items() if owner == door]

    def _forward(self, item: StreamItem) -> None:
        door = self._door_of.get(item.request_id, 0)
        if not isinstance(item.item, AudioChunk):
            self._door_of.pop(item.request_id, None)
        self._outboxes[door].item(item)


class Outbox:
    """What the core sends, gathered over one turn of its event loop and written as one Batch."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._batch = Batch()
        self._is_flush_scheduled = False
        self._is_closed = False
        self.engine: Engine | None = None  # once loaded: its occupancy and runner call go out with every batch

    def close(self) -> None:
        """Its front door has gone: nothing more is written (a write to a lost socket only logs, at every beat)."""
        self._is_closed = True
        self._writer.close()

    def item(self, item: StreamItem) -> None:
        self._batch.items.append(item)
        self._schedule_flush()

    def reply(self, reply: Reply) -> None:
        self._batch.replies.append(reply)
        self._schedule_flush()

    def step(self, step: StepObservation) -> None:
        self._batch.steps.append(step)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._is_flush_scheduled:
            self._is_flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._is_flush_scheduled = False
        batch = self._batch
        if batch.items or batch.replies or batch.steps:
            self._send()

    async def beat_every(self, interval_s: float) -> None:
        """Send a batch, empty or not, every `interval_s`: the server takes a core's silence for a stall."""
        while True:
            await asyncio.sleep(interval_s)
            self._send()

    def _send(self) -> None:
        if self._is_closed:
            self._batch = Batch()
            return
        batch, engine = self._batch, self.engine
        if engine is not None:
            batch = replace(batch, occupancy=engine.occupancy(), runner_call_since=engine.runner_call_since)
        send(self._writer, batch)
        self._batch = Batch()


# -- voices cross as numpy: a pickled CUDA tensor would start CUDA in the server's process ------------


def clone_to_wire(clone: VoiceClone) -> VoiceClone:
    embedding = clone.speaker_embedding
    if isinstance(embedding, torch.Tensor):
        embedding = embedding.detach().float().cpu().numpy()
    return replace(clone, speaker_embedding=embedding)


def clone_from_wire(clone: VoiceClone) -> VoiceClone:
    embedding = clone.speaker_embedding
    if isinstance(embedding, np.ndarray):
        embedding = torch.from_numpy(embedding)
    return replace(clone, speaker_embedding=embedding)


def _to_wire(value: Any) -> Any:
    if isinstance(value, VoiceClone):
        return clone_to_wire(value)
    if isinstance(value, RegisteredVoice):
        return replace(value, clone=clone_to_wire(value.clone))
    if isinstance(value, list):
        return [_to_wire(item) for item in value]
    return value


def _request_from_wire(request: SynthesisRequest) -> SynthesisRequest:
    clone = request.synthesis.clone
    if clone is None:
        return request
    return replace(request, synthesis=replace(request.synthesis, clone=clone_from_wire(clone)))


class CoreBridge:
    """Server messages -> engine calls; engine results -> the outbox.

    It dispatches exactly the operations door.py declares, bound to the engine here: an engine that lacks one,
    or has it of the wrong kind, fails the bridge's construction, which comes before the core says it is ready."""

    def __init__(self, engine: Engine, outbox: Outbox, router: StreamRouter, door: int = 0) -> None:
        self.engine = engine
        self.outbox = outbox
        self._router = router
        self._door = door
        self._calls = bound_operations(engine, CALLS, awaited=True) | {_SUBMIT: self._submit}
        self._notices = bound_operations(engine, NOTICES, awaited=False)
        self._tasks: set[asyncio.Task[None]] = set()
        # Notices (text, abort, ...) for a request whose submit is still being answered, by request id: the
        # server sends an open request's text without waiting for that answer, and the text must follow it.
        self._held_notices: dict[str, list[Notice]] = {}

    def handle(self, message: Call | Notice) -> None:
        if isinstance(message, Notice):
            held = self._held_notices.get(message.args[0])
            if held is not None:
                held.append(message)
            else:
                self._apply(message)
            return
        if message.method == _SUBMIT:
            # A front door never reuses the id of a request it still has (it refuses that itself).
            request_id = message.args[0].request_id
            self._router.admit(self._door, request_id)
            self._held_notices[request_id] = []
        task = asyncio.get_running_loop().create_task(self._answer(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _apply(self, notice: Notice) -> None:
        try:
            self._notices[notice.method](*notice.args)
        except Exception:  # a notice has nobody waiting for it: the request's stream carries what follows
            logger.exception("the engine refused %s for %r", notice.method, notice.args[:1])

    def abort_all(self) -> None:
        """The front door has gone: its requests end (nobody reads them)."""
        for request_id in self._router.live_request_ids(self._door):
            self._apply(Notice(EngineNotices.abort.__name__, (request_id,)))

    async def _answer(self, call: Call) -> None:
        try:
            value = await self._calls[call.method](*call.args)
        except Exception as error:
            self.outbox.reply(Reply(call.call_id, error=portable(error)))
            return
        self.outbox.reply(Reply(call.call_id, value=_to_wire(value)))

    async def _submit(self, request: SynthesisRequest) -> None:
        """The request into the engine, then the notices that arrived for it meanwhile (none if it was
        refused: its stream has ended)."""
        try:
            await self.engine.submit(_request_from_wire(request))
        except BaseException:
            self._router.release(self._door, request.request_id)
            raise
        finally:
            held = self._held_notices.pop(request.request_id, [])
        for notice in held:
            self._apply(notice)


async def _serve(spec: CoreSpec, channels: Sequence[socket.socket],
                 load: Callable[[CoreSpec, NewStream], Engine]) -> None:
    connections = [await asyncio.open_unix_connection(sock=channel) for channel in channels]
    writers = [writer for _, writer in connections]
    outboxes = [Outbox(writer) for writer in writers]
    router = StreamRouter(outboxes)
    try:
        engine = await asyncio.to_thread(load, spec, router.new_stream)
    except Exception as error:  # the server's process logs why and exits
        for writer in writers:
            send(writer, LoadFailed(portable(error)))
        await _close_all(writers)
        return
    for outbox in outboxes:
        outbox.engine = engine
    engine.add_step_observer(outboxes[0].step)  # the owner's metrics count the engine's steps, once
    bridges = [CoreBridge(engine, outbox, router, door) for door, outbox in enumerate(outboxes)]
    logger.info("the engine core froze %d start-up objects out of the garbage collector's walks",
                freeze_startup_objects())
    gc_watch = watch_pauses("engine core")
    engine.start()
    for writer in writers:
        send(writer, Ready(engine.model_info, engine.captured_graph_batch_sizes(), engine.max_unread_frames,
                           engine.occupancy()))
    beat_s = spec.stall_timeout_s / _BEATS_PER_STALL_TIMEOUT
    beating = [asyncio.ensure_future(outbox.beat_every(beat_s)) for outbox in outboxes]
    (owner_reader, _), *further = connections
    receiving = asyncio.ensure_future(_receive_until_stop(owner_reader, bridges[0]))
    further_receiving = [asyncio.ensure_future(_receive_from_further_door(reader, bridge))
                         for (reader, _), bridge in zip(further, bridges[1:], strict=True)]
    stepping = asyncio.ensure_future(engine.join())
    try:
        await asyncio.wait((receiving, stepping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (*beating, receiving, *further_receiving):
            task.cancel()
        with contextlib.suppress(Exception):  # a loop that failed has logged why; its requests end below all the same
            await engine.stop()  # what is still live ends with an error, which goes out in the last batch
        for outbox in outboxes:
            with contextlib.suppress(ConnectionError):  # a front door may be gone: nobody to tell
                outbox.flush()
        await _close_all(writers)
        gc.callbacks.remove(gc_watch)
        thaw_startup_objects()
    if stepping.done() and stepping.exception() is not None:  # the loop failed: the server sees the core exit
        raise SystemExit(1)


async def _close_all(writers: Sequence[asyncio.StreamWriter]) -> None:
    for writer in writers:
        with contextlib.suppress(ConnectionError):
            await writer.drain()
            writer.close()
            await writer.wait_closed()


async def _receive_from_further_door(reader: asyncio.StreamReader, bridge: CoreBridge) -> None:
    """A front door beside the owner: what it sends, until it goes (or says Stop, its way of going), which ends its
    requests and nothing else."""
    try:
        while not isinstance(message := await receive(reader), Stop):
            assert isinstance(message, Call | Notice)
            bridge.handle(message)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    logger.info("a front door beside the core's owner has gone: its requests end")
    bridge.outbox.close()
    bridge.abort_all()


async def _receive_until_stop(reader: asyncio.StreamReader, bridge: CoreBridge) -> None:
    try:
        while not isinstance(message := await receive(reader), Stop):
            assert isinstance(message, Call | Notice)
            bridge.handle(message)
    except (asyncio.IncompleteReadError, ConnectionError):
        logger.warning("the server's process has gone: the engine core stops")
