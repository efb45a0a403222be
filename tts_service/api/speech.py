"""The steps of a speech call that both front doors take, the gRPC servicer (`server.py`) and the OpenAI-compatible
HTTP API (`openai_http.py`), so that a call is limited, observed and answered alike through either.

`SpeechSteps` holds what a call needs once the door has parsed it into qwen3_tts.v1 messages: the call's frame
(`speech_call`: request id, per-caller limit, drain tracking, metrics, span and log tags, the server's limit on
its life), its checks and voice (`prepare`), its queueing (`submit`) and its audio (`encoded_audio` as the engine
produces it, `whole_audio` once it has ended). Errors are ApiErrors with gRPC's status codes, which each door
translates into its own protocol. Neither door imports the other: the server builds one SpeechSteps and hands it
to both.

Every engine call happens on the event loop's thread, as the engine requires. Reference audio is decoded in a
worker thread and the engine clones voices in its own, so that the loop keeps serving. The steps talk to the
engine's public methods only, never to its runner or scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import numpy as np

from observability.calls import CallRecord, CallResult
from observability.logs import bind_call
from observability.metrics import ServiceMetrics
from observability.tracing import CallTracer, trace_id_of
from tts_service.api.call_limits import call_too_long_error
from tts_service.api.callers import Credentials
from tts_service.api.config import ServerConfig
from tts_service.api.errors import ApiError
from tts_service.api.inline_clones import InlineClones, inline_clone_key
from tts_service.api.interceptors import MAX_BYTES_PARSED_ON_LOOP, ServingState
from tts_service.api.lexicon_store import LexiconLimits, LexiconStore
from tts_service.api.lexicons import Lexicon
from tts_service.api.messages import (
    ChunkEncoder,
    check_clone_request,
    check_input_limits,
    decode_reference,
    generation_params,
    lexicon_of,
    non_streaming_text,
    run_encoder,
    synthesis_input,
)
from tts_service.api.voices import check_voice_selection_by_id, not_found
from tts_service.api.word_timestamps import OffsetMap, TimedWord, WordTracker
from tts_service.audio.output import OutputFormat
from tts_service.audio.reference import AudioLimits
from tts_service.engine import (
    EngineDoor,
    FinishReason,
    GenerationParams,
    RegisteredVoice,
    RequestFailed,
    RequestStream,
    SynthesisInput,
    SynthesisRequest,
    SynthesisSummary,
    VoiceClone,
    VoiceNotFoundError,
)

# The front door's lines under one logger, whichever of its modules writes them (as errors.py's and openai_http.py's).
logger = logging.getLogger("tts_service.api.server")

T = TypeVar("T")
# How long past the server's call limit a call may stay open (only one whose writes are stuck does).
_STUCK_CALL_GRACE_S = 5.0


class CallTracker:
    """Counts the calls in progress, in all (so that draining can wait for them) and by caller (so that one
    caller cannot take every place: beyond `max_calls_per_caller` its calls get RESOURCE_EXHAUSTED)."""

    def __init__(self, max_calls_per_caller: int | None = None) -> None:
        self.num_active = 0
        self._max_calls_per_caller = max_calls_per_caller
        self._num_by_caller: Counter[str] = Counter()
        self._idle = asyncio.Event()
        self._idle.set()

    def track(self, caller: str = "") -> _TrackedCall:
        """A call of `caller` in progress while the context is entered (RESOURCE_EXHAUSTED past the caller's
        limit)."""
        return _TrackedCall(self, caller)

    def _enter(self, caller: str) -> None:
        limit = self._max_calls_per_caller
        if limit is not None and self._num_by_caller[caller] >= limit:
            raise ApiError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"this caller already has {limit} calls in progress, the most one caller may have "
                           "(--max-calls-per-caller); retry when one has ended")
        self.num_active += 1
        self._num_by_caller[caller] += 1
        self._idle.clear()

    def _leave(self, caller: str) -> None:
        self.num_active -= 1
        self._num_by_caller[caller] -= 1
        if not self._num_by_caller[caller]:
            del self._num_by_caller[caller]
        if self.num_active == 0:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        return self.num_active == 0


class _ObservedCall:
    """`SpeechSteps._observed`'s context, a class for the reason `_TrackedCall` is one."""

    __slots__ = ("_ending_status", "_metadata", "_record", "_span", "_steps", "_tracer")

    def __init__(self, steps: SpeechSteps, record: CallRecord, metadata: Iterable[tuple[str, str | bytes]],
                 ending_status: EndingStatus) -> None:
        self._steps = steps
        self._record = record
        self._metadata = metadata
        self._ending_status = ending_status
        self._tracer: CallTracer | None = None
        self._span: Any = None

    async def __aenter__(self) -> None:
        record, self._tracer = self._record, self._steps.tracer
        self._span = self._tracer.start(record, self._metadata) if self._tracer is not None else None
        bind_call(record.request_id, trace_id_of(self._span) if self._span is not None else None)

    async def __aexit__(self, exc_type: type[BaseException] | None, error: BaseException | None,
                        traceback: object) -> None:
        status = "OK"
        try:
            if error is not None:
                status = self._ending_status(self._record, error)
        finally:
            self._steps._end_observation(self._record, status, self._tracer, self._span)


class _TrackedCall:
    """`CallTracker.track`'s context: a class, not a generator, because every call in flight holds one, and a
    generator-based context brings an async generator, its weak reference and its context manager besides, each
    an object a full garbage collection walks (its pause grows with the objects the calls in flight hold)."""

    __slots__ = ("_caller", "_calls")

    def __init__(self, calls: CallTracker, caller: str) -> None:
        self._calls = calls
        self._caller = caller

    async def __aenter__(self) -> None:
        self._calls._enter(self._caller)

    async def __aexit__(self, *exc_info: object) -> None:
        self._calls._leave(self._caller)


@dataclass(frozen=True)
class PreparedRequest:
    request_id: str
    synthesis: SynthesisInput
    params: GenerationParams


@dataclass(frozen=True)
class EncodedAudio:
    """One piece of a request's encoded audio; the last piece carries the summary (and maybe no audio)."""

    chunk: Any | None  # an AudioChunk message
    summary: SynthesisSummary | None = None
    words: tuple[TimedWord, ...] = ()  # words whose timings became known since the last piece


class ListenerLead:
    """How far a listener who started playing at the first chunk is from running out: audio sent minus audio
    played, at the time of the last chunk."""

    def __init__(self, frame_rate_hz: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._frame_s = 1.0 / frame_rate_hz
        self._clock = clock  # the listener's playback clock
        self._first_sent: float | None = None
        self._num_frames = 0
        self.lead_s = 0.0

    def sent(self, num_frames: int) -> None:
        now = self._clock()
        if self._first_sent is None:
            self._first_sent = now
        self._num_frames += num_frames
        self.lead_s = self._num_frames * self._frame_s - (now - self._first_sent)


# How a speech call's status is named when an exception ends it (gRPC's status names, for either front door).
EndingStatus = Callable[[CallRecord, BaseException], str]


class SpeechSteps:
    """A speech call's steps, shared by both front doors, and what they need: the engine (None until the server
    serves it), the metrics and tracer, the calls in progress and the callers' credentials."""

    def __init__(self, config: ServerConfig, calls: CallTracker, credentials: Credentials,
                 state: ServingState) -> None:
        self.config = config
        self.state = state
        self.calls = calls
        self.credentials = credentials
        self.engine: EngineDoor | None = None
        self.metrics: ServiceMetrics | None = None
        self.tracer: CallTracer | None = None
        self.lexicons = LexiconStore.open(
            None if config.engine.voice_store_dir is None else config.engine.voice_store_dir / "lexicons",
            LexiconLimits(config.max_lexicons, config.max_lexicons_per_caller))
        self._reference_limits = AudioLimits(max_seconds=config.engine.max_reference_audio_s)
        # One reference recording decoded at a time: decoding is heavy and must stay off the event loop.
        self._decode_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tts-reference-audio")
        self._num_clones_in_progress = 0
        self._inline_clones = InlineClones(config.max_inline_clones)
        self._expired_ids: set[str] = set()
        self._limited_by_server: set[str] = set()  # calls whose request ends at the server's limit, not the client's

    def close(self) -> None:
        self._decode_executor.shutdown(wait=False, cancel_futures=True)

    @contextlib.asynccontextmanager
    async def speech_call(self, rpc: str, caller: str, metadata: Iterable[tuple[str, str | bytes]],
                          ending_status: EndingStatus,
                          answering: contextlib.AbstractAsyncContextManager[Any] | None = None,
                          http_route: str | None = None) -> AsyncIterator[CallRecord]:
        """A speech call's frame, whichever front door it came through: request id, the per-caller limit, drain
        tracking, observation (metrics, span, log tags), and the server's limit on the call's life. `answering`
        turns errors into the protocol's answer inside the observation, which then sees that answer."""
        record = CallRecord(rpc, uuid.uuid4().hex, http_route)
        # The engine ends the request at the limit; this ends a call stuck writing to a client that reads nothing.
        expiry = asyncio.get_running_loop().call_later(self.config.max_stream_seconds + _STUCK_CALL_GRACE_S,
                                                       self._expire, record, asyncio.current_task())
        try:
            async with (self._observed(record, metadata, ending_status), answering or contextlib.nullcontext(),
                        self.calls.track(caller)):
                try:
                    yield record
                except RequestFailed as error:  # the engine's summary says how far the request got
                    self._finish_record(record, error.summary)
                    raise
        finally:
            expiry.cancel()

    def forget_request(self, request_id: str) -> None:
        """A request that ended apart from its call's end (a streamed call's later utterance)."""
        self._limited_by_server.discard(request_id)

    def was_expired(self, record: CallRecord) -> bool:
        """Whether the server's limit on a call's life ended this call."""
        return record.request_id in self._expired_ids

    def _expire(self, record: CallRecord, task: asyncio.Task[Any] | None) -> None:
        logger.warning("ending a call still open %g s after the server's limit", _STUCK_CALL_GRACE_S)
        self._expired_ids.add(record.request_id)
        if task is not None:
            task.cancel()

    def _observed(self, record: CallRecord, metadata: Iterable[tuple[str, str | bytes]],
                  ending_status: EndingStatus) -> _ObservedCall:
        """The call's span and log tags from its start; metrics and the span's end with the status it ends with."""
        return _ObservedCall(self, record, metadata, ending_status)

    def _end_observation(self, record: CallRecord, status: str, tracer: CallTracer | None, span: Any) -> None:
        self._expired_ids.discard(record.request_id)
        self._limited_by_server.discard(record.request_id)
        if self.metrics is not None:
            self.metrics.observe_call(record, status)
        if tracer is not None and span is not None:
            tracer.end(span, record, status)

    def _finish_record(self, record: CallRecord, summary: SynthesisSummary) -> None:
        model = self.engine_or_unavailable().model_info
        record.result = CallResult(summary.finish_reason.value, summary.timeline, summary.num_frames,
                                   summary.num_text_tokens, model.audio_seconds(summary.num_frames),
                                   summary.segment_retries)

    def count_refusal(self, rpc: str, code: grpc.StatusCode) -> None:
        """A call refused before it ran (no valid key, the server not serving), on either front door."""
        if self.metrics is not None:
            self.metrics.observe_refusal(rpc, code.name)

    @property
    def aligner(self) -> str | None:
        """The forced aligner beside the engine (what --aligner-model named); None: no word timestamps."""
        return self.engine_or_unavailable().model_info.aligner

    def engine_or_unavailable(self) -> EngineDoor:
        if self.engine is None:
            raise ApiError(grpc.StatusCode.UNAVAILABLE, "the server is still loading its model; retry")
        return self.engine

    def request_lexicon(self, request: Any, owner: str) -> Lexicon | None:
        """The pronunciation lexicon a request (SynthesizeRequest or StreamingSynthesizeConfig) asks for: its
        registered lexicons in order (the owner's), then its own entries; None when it asks for none."""
        parts = [self.lexicons.get(owner, lexicon_id, f"lexicon_ids[{index}]").lexicon
                 for index, lexicon_id in enumerate(request.lexicon_ids)]
        parts.append(lexicon_of(request.lexicon, "lexicon"))
        combined = Lexicon.combined(parts)
        return combined if combined.entries else None

    async def prepare(self, record: CallRecord, text: str, voice: Any, generation: Any,
                      owner: str, spoken_text: str | None = None, is_text_streamed: bool = False) -> PreparedRequest:
        """Check the request (a qwen3_tts.v1 VoiceSelection and GenerationConfig: the engine checks the voice at submit)
        and clone its voice, if any; a registered voice is looked up among `owner`'s (see callers.Identity). The
        limits hold `text` as the client sent it; the model says `spoken_text` (its lexicon applied) when given.
        `is_text_streamed`: the text is to come in pieces (`text` is empty)."""
        engine = self.engine_or_unavailable()
        check_input_limits(text, voice, self.config.input_limits)
        is_whole_text = not is_text_streamed
        params = generation_params(generation, self.config, engine.model_info, text if is_whole_text else None)
        record.num_text_chars = len(text)
        clone = await self._voice_clone(engine, voice, record, owner)
        # Whole-text calls default as qwen-tts does for the model; streamed text keeps streaming.
        default = engine.model_info.default_non_streaming_text if is_whole_text else False
        spoken = text if spoken_text is None else spoken_text
        return PreparedRequest(record.request_id,
                               synthesis_input(spoken, voice, clone, non_streaming_text(generation, default)),
                               params)

    async def _voice_clone(self, engine: EngineDoor, voice: Any, record: CallRecord, owner: str) -> VoiceClone | None:
        """The request's cloned voice: a registered one, or one cloned from its reference audio; None for none."""
        if voice.voice_id:
            check_voice_selection_by_id(voice, engine.model_info)
            registered = await self.registered_voice(engine, voice.voice_id, owner, "voice.voice_id")
            return registered.clone
        if not voice.reference_audio:
            return None
        # Kept only once cloned, so its every field passed encode_reference's checks. A digest of a large recording
        # (up to 24 MiB, tens of milliseconds) is taken in a worker thread, as a large message is parsed in one.
        if len(voice.reference_audio) <= MAX_BYTES_PARSED_ON_LOOP:
            key = inline_clone_key(owner, voice)
        else:
            key = await asyncio.to_thread(inline_clone_key, owner, voice)
        clone = self._inline_clones.get(key)
        if clone is None:
            clone = await self.encode_reference(engine, voice, record, lambda wav: engine.clone_voice(
                wav, voice.reference_text or None, voice.x_vector_only))
            self._inline_clones.put(key, clone)
        return clone

    async def registered_voice(self, engine: EngineDoor, voice_id: str, owner: str, field: str) -> RegisteredVoice:
        """`owner`'s voice `voice_id`; NOT_FOUND, naming the request's `field`, when it has none by that id."""
        try:
            return await engine.registered_voice(voice_id, owner)
        except VoiceNotFoundError:
            raise not_found(field, voice_id) from None

    async def encode_reference(self, engine: EngineDoor, voice: Any, record: CallRecord,
                               encode: Callable[[np.ndarray], Awaitable[T]]) -> T:
        """Decode the reference audio of `voice` (a VoiceSelection, or a CreateVoiceRequest, which has the same
        reference fields) and `encode` it, within the server's limit on clones in progress."""
        check_clone_request(voice, engine.model_info)
        if self._num_clones_in_progress >= self.config.max_waiting_clones:
            raise ApiError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"{self._num_clones_in_progress} voice clones are already being encoded, the most the "
                           "server queues (--max-waiting-clones); retry shortly")
        self._num_clones_in_progress += 1
        started = time.monotonic()
        try:
            wav = await asyncio.get_running_loop().run_in_executor(self._decode_executor, decode_reference, voice,
                                                                   self._reference_limits)
            return await encode(wav)
        finally:
            self._num_clones_in_progress -= 1
            record.voice_clone = (started, time.monotonic())

    async def submit(self, prepared: PreparedRequest, record: CallRecord, remaining_s: float | None,
                     is_text_open: bool) -> RequestStream:
        """Queue the request; its engine deadline is the call's deadline (`remaining_s` away; None: no deadline)
        or the server's limit, the sooner."""
        engine = self.engine_or_unavailable()
        max_seconds = self.config.max_stream_seconds
        deadline = engine.deadline_in(max_seconds if remaining_s is None else min(remaining_s, max_seconds))
        if remaining_s is None or max_seconds < remaining_s:
            self._limited_by_server.add(prepared.request_id)
        stream = await engine.submit(SynthesisRequest(prepared.request_id, prepared.synthesis, prepared.params,
                                                is_text_open=is_text_open, deadline=deadline))
        record.is_submitted = True
        return stream

    def word_tracker(self, language: str, text: str = "", is_text_closed: bool = False,
                     mapping: OffsetMap | None = None, original: str = "") -> WordTracker:
        """A request's word timings, from the server's aligner (see `check_word_timestamps`); with a lexicon,
        `text` is what is said and `mapping` leads back to `original`, the text as sent."""
        engine = self.engine_or_unavailable()
        language = language.lower()
        return WordTracker(engine.align_words, engine.model_info.sample_rate,
                           None if language in ("", "auto") else language, text, is_text_closed, mapping, original)

    async def encoded_audio(self, stream: RequestStream, output: OutputFormat, record: CallRecord,
                            words: WordTracker | None = None) -> AsyncGenerator[EncodedAudio, None]:
        """The stream's audio encoded as it comes; the last piece carries the summary, the record then finished.
        With `words`, the timings it commits come in pieces of their own, all of them before the summary."""
        try:
            async for piece in self._encoded_audio(stream, output, record, words):
                yield piece
        finally:
            if words is not None:
                await words.cancel()

    async def _encoded_audio(self, stream: RequestStream, output: OutputFormat, record: CallRecord,
                             words: WordTracker | None) -> AsyncGenerator[EncodedAudio, None]:
        encoder = ChunkEncoder(output)
        profile = self._server_phase_timer()
        frame_rate_hz = self.engine_or_unavailable().model_info.frame_rate_hz
        listener = ListenerLead(frame_rate_hz)
        num_coalesced_frames = max(1, round(self.config.coalesced_message_seconds * frame_rate_hz))
        async for piece in stream:
            if record.first_audio_received is None:
                record.first_audio_received = stream.first_audio_time
            started = time.perf_counter()
            chunk = await run_encoder(encoder, lambda piece=piece: encoder.encode(piece.samples))
            if chunk is not None:
                record.add_chunk(chunk.offset_seconds)
                encoded = time.perf_counter()
                yield EncodedAudio(chunk)
                if profile is not None:  # the yield returns once the front door has written the chunk
                    profile("encode", encoded - started)
                    profile("write", time.perf_counter() - encoded)
            listener.sent(piece.num_frames)
            is_ahead = listener.lead_s >= self.config.coalesce_when_ahead_seconds
            stream.take_at_least(num_coalesced_frames if is_ahead else 1)
            if words is not None:
                words.add_audio(piece.samples)
                if timed := words.take_words():
                    yield EncodedAudio(None, words=timed)
        summary = stream.summary
        assert summary is not None
        if words is not None and summary.finish_reason is not FinishReason.ABORTED:
            # An aborted request's text was not all spoken: its words committed so far are all it gets.
            await words.finish()
            if timed := words.take_words():
                yield EncodedAudio(None, words=timed)
        chunk = await run_encoder(encoder, encoder.finish)
        if chunk is not None:
            record.add_chunk(chunk.offset_seconds)
        self._finish_record(record, summary)
        self._log_done(summary)
        yield EncodedAudio(chunk, summary)

    async def whole_audio(self, stream: RequestStream, record: CallRecord) -> tuple[np.ndarray, SynthesisSummary]:
        """A request's whole waveform once it has ended, its record finished; a request the server's limit or the
        call's deadline aborted is an error."""
        try:
            waveform, summary = await stream.collect()
        finally:
            self.engine_or_unavailable().abort(record.request_id)
        self._end_whole(record, summary)
        return waveform, summary

    async def written_audio(self, stream: RequestStream, record: CallRecord,
                            write: Callable[[np.ndarray], None]) -> SynthesisSummary:
        """As `whole_audio`, each piece of the audio handed to `write` (in a worker thread) as it comes instead of
        kept: a long document's samples are never all held."""
        try:
            async for piece in stream:
                await asyncio.to_thread(write, piece.samples)
        finally:
            self.engine_or_unavailable().abort(record.request_id)
        summary = stream.summary
        assert summary is not None
        self._end_whole(record, summary)
        return summary

    def _end_whole(self, record: CallRecord, summary: SynthesisSummary) -> None:
        if summary.finish_reason is FinishReason.ABORTED:
            raise self.deadline_error(record)
        self._finish_record(record, summary)
        self._log_done(summary)

    def deadline_error(self, record: CallRecord) -> ApiError:
        """Why a request whose call is still open was aborted: the server's limit, or the client's deadline, came
        first (said even when the client's deadline passed only a moment ago, rather than ending with OK)."""
        if record.request_id in self._limited_by_server:
            return call_too_long_error(self.config)
        return ApiError(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed before its audio was done")

    def _server_phase_timer(self) -> Callable[[str, float], None] | None:
        """With the step profiler on and metrics kept: records the server's own work per chunk."""
        if self.metrics is None or not self.config.engine.profile_steps:
            return None
        return self.metrics.observe_server_phase

    @staticmethod
    def _log_done(summary: SynthesisSummary) -> None:
        logger.info("%s after %d frames (%d text tokens), queued %.3f s, first audio %s",
                    summary.finish_reason.value, summary.num_frames, summary.num_text_tokens,
                    summary.queue_time_s or 0.0, "-" if summary.time_to_first_audio_s is None
                    else f"{summary.time_to_first_audio_s:.3f} s")
