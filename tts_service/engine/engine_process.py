"""The engine as the server's process sees it when the engine core runs in a process of its own.

`EngineProcess` offers the engine's door (submit, text, abort, voices, model_info, occupancy, step
observers) and forwards each call to the core (core_process.py) over a socket pair (wire.py). Request
streams live here: the core sends their audio as it is made, and a stream's reader, here, decides when
its request must pause. If the core's process exits without being asked to, every live stream fails
(EngineCoreLost: the server answers UNAVAILABLE, for the client to retry elsewhere), every waiting call raises
EngineStoppedError (UNAVAILABLE), and `wait_exited()` returns, so the server can stop serving.

A core can also stop without exiting (SIGSTOP, a step that never returns). While this process holds requests or
calls for the core, it expects progress within the stall timeout: a message from the core (it beats even when it
has nothing to say), and no runner call that has lasted that long. A core that makes none is killed, and what it
held ends as if it had exited.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import multiprocessing
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np

from observability.calls import RequestTimeline
from scheduler.request import FinishReason
from tts_service.engine.core_process import STACKS_SIGNAL, CoreSpec, run_core
from tts_service.engine.door import EngineCalls, EngineNotices, declared_name
from tts_service.engine.engine import EngineOccupancy, EngineStats, EngineStoppedError
from tts_service.engine.model_info import ModelInfo
from tts_service.engine.step_observers import StepObservers
from tts_service.engine.streams import AudioChunk, RequestFailed, RequestStream, SynthesisRequest, SynthesisSummary
from tts_service.engine.voice_files import RegisteredVoice
from tts_service.engine.warm_up import warm_up
from tts_service.engine.wire import Batch, Call, LoadFailed, Notice, Ready, Reply, Stop, receive, send
from tts_service.model.aligner import AlignmentItem, WordTiming
from tts_service.model.prompts import VoiceClone

logger = logging.getLogger(__name__)

T = TypeVar("T")

# After Stop, how long the core may take to end its requests and exit before it is killed.
_EXIT_GRACE_S = 30.0
# How long a stalled core has to write its threads' stacks before it is killed.
_STACKS_GRACE_S = 0.5


# A failed request's summary from here: its codes went down with the core.
_NO_CODES = np.zeros((0, 0), dtype=np.int64)


class EngineCoreExited(RuntimeError):
    """The engine core's process ended while the server still needed it."""


class EngineCoreLost(RequestFailed):
    """The engine core went (it exited, was stopped, or was killed for a stall) with the request still in it: the
    request did nothing wrong, and another try, on a server whose engine runs, may well succeed."""


class _ProgressWatch:
    """Calls `on_stall` once the core has made no progress for `bound_s` while `holds_work()` says it owes something.

    No timer runs while nothing is owed: `watch()` is called whenever work is handed over, and the check re-arms
    itself for as long as work is held."""

    def __init__(self, bound_s: float, clock: Callable[[], float], holds_work: Callable[[], bool],
                 on_stall: Callable[[], None]) -> None:
        self.bound_s = bound_s
        self._clock = clock
        self._holds_work = holds_work
        self._on_stall = on_stall
        self._last_progress = clock()
        self._timer: asyncio.TimerHandle | None = None

    def progressed(self, at: float) -> None:
        self._last_progress = at

    def watch(self) -> None:
        if self._timer is None:
            delay_s = self._last_progress + self.bound_s - self._clock()
            self._timer = asyncio.get_running_loop().call_later(delay_s, self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        if not self._holds_work():
            return
        if self._clock() - self._last_progress >= self.bound_s:
            self._on_stall()
        else:
            self.watch()


class _Pending:
    """A stream the core is filling: how many frames have arrived (for the summary if the core dies)."""

    def __init__(self, stream: RequestStream, arrival_time: float) -> None:
        self.stream = stream
        self.arrival_time = arrival_time
        self.num_frames = 0


class EngineProcess(StepObservers):
    """The engine core in its own process, behind the engine's door."""

    def __init__(self, process: multiprocessing.process.BaseProcess | None, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, ready: Ready, stall_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self._process = process  # None: a front door beside the core's owner (`attach`)
        # Sockets for further front doors of the same core (`start`'s num_further_doors): each is taken from the list
        # (popped) by whoever attaches it, here or in another process; those never taken are closed at `stop`.
        self.further_channels: list[socket.socket] = []
        self._writer = writer
        self.model_info: ModelInfo = ready.model_info
        self.max_unread_frames = ready.max_unread_frames
        self._graph_batch_sizes = ready.captured_graph_batch_sizes
        self._occupancy = ready.occupancy
        self._streams: dict[str, _Pending] = {}
        self._replies: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self.stats = EngineStats()  # from the core's step observations: its runner's own time is not among them
        self._is_stopping = False
        self._exited = asyncio.Event()
        # From Ready on: the start-up's loading and graph capture are behind it.
        self._watch = _ProgressWatch(stall_timeout_s, clock, self._holds_work, self._on_stall)
        self._loop = asyncio.get_running_loop()
        self._receiving = self._loop.create_task(self._receive(reader), name="tts-engine-core")

    @classmethod
    async def start(cls, spec: CoreSpec, target: Callable[[CoreSpec, list[socket.socket]], None] | None = None,
                    num_further_doors: int = 0) -> EngineProcess:
        """Start the core's process (`target`: its entry point, a module-level function; `run_core` unless given) and
        wait until its engine runs. Raises what loading raised there (a CheckpointError, say), or EngineCoreExited
        when the process died before it could say. With `num_further_doors`, the core also serves that many front
        doors beside this one, each attached (`attach`) to one of `further_channels`."""
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(1 + num_further_doors)]
        ours = [end for end, _ in pairs]
        theirs = [end for _, end in pairs]
        # Spawned, not forked: CUDA cannot start in a child forked from a process that may have touched it.
        process = multiprocessing.get_context("spawn").Process(
            target=target or run_core, args=(spec, theirs), name="tts-engine-core")
        try:
            process.start()
        except BaseException:
            for end in ours:
                end.close()
            raise
        finally:
            for end in theirs:
                end.close()  # the core holds the only other ends, so its exit closes ours
        reader, writer = await asyncio.open_unix_connection(sock=ours[0])

        def close_ours() -> None:
            writer.close()
            for end in ours[1:]:
                end.close()

        try:
            first = await receive(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            first = None
        except asyncio.CancelledError:  # the server stops during the load
            process.kill()
            close_ours()
            raise
        if isinstance(first, Ready):
            logger.info("the engine core runs in process %d", process.pid)
            door = cls(process, reader, writer, first, spec.stall_timeout_s)
            door.further_channels = ours[1:]
            return door
        close_ours()
        await asyncio.to_thread(process.join, _EXIT_GRACE_S)
        if isinstance(first, LoadFailed):
            raise first.error
        raise EngineCoreExited(f"the engine core's process exited with status {process.exitcode} while loading")

    @classmethod
    async def attach(cls, channel: socket.socket, stall_timeout_s: float) -> EngineProcess:
        """A front door beside the core's owner, on one of the owner's `further_channels` (handed to this process):
        the same door, except that it neither stops the core nor kills it. Its going ends its own requests in the
        core; the core's going ends them here as for the owner. Raises EngineCoreExited if the core went before it
        said it runs."""
        reader, writer = await asyncio.open_unix_connection(sock=channel)
        try:
            first = await receive(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            first = None
        if not isinstance(first, Ready):
            writer.close()
            raise EngineCoreExited("the engine core went before it could serve this front door")
        return cls(None, reader, writer, first, stall_timeout_s)

    # -- what the server reads ------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return not (self._is_stopping or self._exited.is_set())

    @property
    def num_cores_running(self) -> int:
        return int(self.is_running)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def is_alive(self) -> bool:
        """Whether the core's process still runs (it may be ending); beside the owner, whether it still serves this
        front door."""
        return not self._exited.is_set() if self._process is None else self._process.is_alive()

    @property
    def num_live_requests(self) -> int:
        return len(self._streams)

    def holds(self, request_id: str) -> bool:
        """Whether the request's stream is still being filled by this core."""
        return request_id in self._streams

    def occupancy(self) -> EngineOccupancy:
        """The engine's load as of the core's last message (it sends one whenever anything changes)."""
        return self._occupancy

    def captured_graph_batch_sizes(self) -> dict[str, list[int]]:
        return self._graph_batch_sizes

    async def wait_exited(self) -> None:
        """Return once the core's process has gone (asked to or not)."""
        await self._exited.wait()

    async def wait_cores_changed(self, num_running_seen: int) -> bool:
        """As EngineCores': one core's only change is its end, after which it never runs again."""
        await self.wait_exited()
        return False

    # -- calls ------------------------------------------------------------------------------------

    async def submit(self, request: SynthesisRequest) -> RequestStream:
        """As Engine.submit: raises what the engine raised there, and EngineStoppedError once the core is gone.

        A request with open text is the exception: its stream comes back as soon as the request is sent, so
        that its text follows at once instead of a round trip to the core later (the core holds it until the
        request is in). Nothing of it could run before its text anyway. If the engine refuses it, its stream
        ends with the engine's error, which the reader gets as it would have got it here."""
        request_id = request.request_id
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        stream = RequestStream(request_id, self.max_unread_frames,
                               lambda is_paused: self.set_output_paused(request_id, is_paused))
        reply = self._send_call(EngineCalls.submit, request)
        # Registered before the answer: the core may send audio in the same batch as its reply.
        self._streams[request_id] = _Pending(stream, self.clock())
        if request.is_text_open:
            reply.add_done_callback(functools.partial(self._end_if_refused, request_id))
            return stream
        try:
            await reply
        except BaseException:
            self._streams.pop(request_id, None)
            raise
        return stream

    def _end_if_refused(self, request_id: str, reply: asyncio.Future[Any]) -> None:
        error = None if reply.cancelled() else reply.exception()
        if error is None:
            return
        pending = self._streams.pop(request_id, None)
        if pending is not None:
            pending.stream.fail(error)  # type: ignore[arg-type]

    def append_text(self, request_id: str, fragment: str) -> None:
        if request_id in self._streams and fragment:
            self._notify(EngineNotices.append_text, request_id, fragment)

    def close_text(self, request_id: str) -> None:
        if request_id in self._streams:
            self._notify(EngineNotices.close_text, request_id)

    def abort(self, request_id: str) -> None:
        if request_id in self._streams:
            self._notify(EngineNotices.abort, request_id)

    def set_output_paused(self, request_id: str, is_paused: bool) -> None:
        """Its stream's reader fell behind (pause the request in the core) or caught up (resume it)."""
        self._notify(EngineNotices.set_output_paused, request_id, is_paused)

    async def warm_up(self) -> bool:
        """The warm-up synthesis, from here: it crosses the socket as every request will."""
        return await warm_up(self)

    async def clone_voice(self, wav_24k: np.ndarray, reference_text: str | None, x_vector_only: bool) -> VoiceClone:
        return await self._call(EngineCalls.clone_voice, wav_24k, reference_text, x_vector_only)

    async def create_voice(self, wav_24k: np.ndarray, reference_text: str | None, x_vector_only: bool,
                           owner: str) -> RegisteredVoice:
        return await self._call(EngineCalls.create_voice, wav_24k, reference_text, x_vector_only, owner)

    async def registered_voice(self, voice_id: str, owner: str) -> RegisteredVoice:
        return await self._call(EngineCalls.registered_voice, voice_id, owner)

    async def registered_voices(self, owner: str) -> list[RegisteredVoice]:
        return await self._call(EngineCalls.registered_voices, owner)

    async def delete_voice(self, voice_id: str, owner: str) -> None:
        await self._call(EngineCalls.delete_voice, voice_id, owner)

    async def align_words(self, item: AlignmentItem) -> list[WordTiming]:
        return await self._call(EngineCalls.align_words, item)

    async def stop(self) -> None:
        """Stop the core (its live requests end with an error: drain first) and wait for its process. Beside the
        owner: leave the core, which ends this front door's requests there, and the streams here."""
        if not self._exited.is_set() and not self._is_stopping:
            self._is_stopping = True
            self._watch.stop()  # the core's own way out has a limit of its own, below
            with contextlib.suppress(ConnectionError):
                send(self._writer, Stop())
                await self._writer.drain()
        # Ends handed to another process are its copies now; ours kept open would keep a gone door's socket alive.
        for channel in self.further_channels:
            channel.close()
        self.further_channels.clear()
        if self._process is None:
            self._writer.close()
            await self._receiving
            return
        await asyncio.to_thread(self._process.join, _EXIT_GRACE_S)
        if self._process.is_alive():
            logger.error("the engine core did not exit %g s after stop: killing it", _EXIT_GRACE_S)
            self._process.kill()
            await asyncio.to_thread(self._process.join)
        await self._receiving

    def _notify(self, operation: Callable[..., None], *args: Any) -> None:
        """Send the notice. `operation` is its declaration in door.py, not its name: a misspelt one fails here as an
        AttributeError, and one the core would not take as a notice as a ValueError, before anything is sent."""
        method = declared_name(operation, EngineNotices)
        if self.is_running:
            send(self._writer, Notice(method, args))

    async def _call(self, operation: Callable[..., Awaitable[T]], *args: Any) -> T:
        return await self._send_call(operation, *args)

    def _send_call(self, operation: Callable[..., Awaitable[T]], *args: Any) -> asyncio.Future[T]:
        """Send the call; the future is its answer. `operation` is its declaration in door.py, as for `_notify`."""
        method = declared_name(operation, EngineCalls)
        if not self.is_running:
            raise EngineStoppedError("the engine is not running")
        call_id = next(self._call_ids)
        reply: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._replies[call_id] = reply
        reply.add_done_callback(lambda _: self._replies.pop(call_id, None))
        send(self._writer, Call(call_id, method, args))
        self._watch.watch()
        return reply

    # -- what the core sends ------------------------------------------------------------------------

    async def _receive(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                batch = await receive(reader)
                assert isinstance(batch, Batch)
                self._apply(batch)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            # Discarded unfinished after its loop closed (a test's, say), the task has nobody left to tell; failing
            # the streams would only raise on that closed loop.
            if not self._loop.is_closed():
                self._on_exit()

    def _apply(self, batch: Batch) -> None:
        # A core whose loop runs but whose step never ends sends batches all the same: it progressed only up to the
        # runner call it still waits for.
        self._watch.progressed(self.clock() if batch.runner_call_since is None else batch.runner_call_since)
        if batch.occupancy is not None:
            self._occupancy = batch.occupancy
        for reply in batch.replies:
            self._settle(reply)
        for entry in batch.items:
            pending = self._streams.get(entry.request_id)
            if pending is None:
                continue
            item = entry.item
            if isinstance(item, AudioChunk):
                pending.num_frames += item.num_frames
                pending.stream.put_audio(item)
                continue
            del self._streams[entry.request_id]
            if isinstance(item, SynthesisSummary):
                pending.stream.finish(item)
            else:
                pending.stream.fail(item)  # type: ignore[arg-type]
        for step in batch.steps:
            self.stats.record(step)
            for observer in self._step_observers:
                observer(step)

    def _settle(self, reply: Reply) -> None:
        future = self._replies.get(reply.call_id)
        if future is None or future.done():
            return
        if reply.error is not None:
            future.set_exception(reply.error)
        else:
            future.set_result(reply.value)

    def _holds_work(self) -> bool:
        return bool(self._streams or self._replies)

    def _on_exit(self) -> None:
        """The socket closed: the core has gone. What it still owed fails here."""
        if self._exited.is_set():  # killed for a stall, which failed it all already
            return
        if self._is_stopping:
            self._fail_everything("the engine stopped")
            return
        logger.error("the engine core's process exited: %d live request(s) fail", len(self._streams))
        self._fail_everything("the engine core's process exited")

    def _on_stall(self) -> None:
        """A core stopped, or stuck in a step, does not come back by itself: it is killed, and what it held fails
        at once rather than when each call's deadline passes."""
        bound_s = self._watch.bound_s
        ending = ("killing it once it has written where its threads are" if self._process is not None
                  else "leaving it to its owner's watch")
        logger.error("the engine core (process %s) made no progress for %g s (--engine-stall-timeout-seconds) "
                     "while it held %d live request(s) and %d call(s): %s", self.pid, bound_s, len(self._streams),
                     len(self._replies), ending)
        if self._process is not None:  # beside the owner, the owner's own watch ends the core
            if self.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, STACKS_SIGNAL)
            asyncio.get_running_loop().call_later(_STACKS_GRACE_S, self._process.kill)
        self._fail_everything(f"the engine core made no progress for {bound_s:g} s")

    def _fail_everything(self, reason: str) -> None:
        """Every waiting call and live stream ends; the socket closes, which ends the receiving task."""
        self._exited.set()
        self._watch.stop()
        self._writer.close()
        for future in self._replies.values():
            if not future.done():
                future.set_exception(EngineStoppedError(reason))
        now = self.clock()
        for request_id, pending in self._streams.items():
            timeline = RequestTimeline(arrival=pending.arrival_time, admitted=None, first_frame=None,
                                       first_audio=None, finished=now)
            pending.stream.fail(EngineCoreLost(SynthesisSummary(
                request_id=request_id, finish_reason=FinishReason.ERROR, num_frames=pending.num_frames,
                num_text_tokens=0, codes=_NO_CODES, timeline=timeline, error=reason)))
        self._streams.clear()
