"""The utterances of one streamed-text call: several requests on one connection, each opened, fed, closed or
cancelled on its own, with their audio merged into the call's one output. Both streamed doors use it, the gRPC
`StreamingSynthesize` call and the WebSocket door, and translate its items into their own messages.

An utterance is one engine request with open text, submitted with the call's voice and settings (cloned once
for the call) and its own request id. Its audio is taken from the engine only when the door can send it: each
utterance has a pump that hands one item at a time to the call's output, so audio a client leaves unread stays in
the engine's stream, which pauses that request. A cancelled utterance is aborted in the engine (it stops at the
next step and its slot is free), audio of it not yet sent is dropped, and its completion says it was cancelled.
Each utterance beyond the call's first takes a place of its caller's (`--max-calls-per-caller`) while it is
open, and is counted in the metrics as a request of its own.

A call outlives its utterances (a voice agent keeps one per conversation), so a draining server would wait for it
until the drain timeout. Instead, once the server drains, the call opens no new utterance (text for one is
dropped, and the call's end says why), an open utterance that has had no text yet is cancelled, and the others are
spoken to their end; then the call ends with UNAVAILABLE, for the client to reconnect to a server that serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from observability.calls import CallRecord
from tts_service.api.callers import Identity
from tts_service.api.errors import ApiError, invalid
from tts_service.api.lexicons import Lexicon, StreamingSubstitution
from tts_service.api.speech import EncodedAudio, PreparedRequest, SpeechSteps
from tts_service.api.word_timestamps import WordTracker, word_timestamps_language
from tts_service.audio.output import OutputFormat
from tts_service.engine import FinishReason, SynthesisSummary

MAX_UTTERANCE_ID_CHARS = 128
_UTTERANCE_ID = re.compile(r"[A-Za-z0-9_.:-]*")
# Flush acks a call may hold unsent before it stops reading its client's messages (gRPC's flow control, or the
# WebSocket's, then holds back a client that floods flushes).
MAX_UNSENT_ACKS = 64


@dataclass(frozen=True)
class UtteranceItem:
    """One item of the call's output: a piece of an utterance's audio (the last carries its summary), or the
    answer to a flush."""

    utterance_id: str
    audio: EncodedAudio | None = None
    flush_marker: str | None = None
    is_cancelled: bool = False  # with the summary: the client cancelled the utterance

    @property
    def summary(self) -> SynthesisSummary | None:
        return None if self.audio is None else self.audio.summary


@dataclass
class _Utterance:
    utterance_id: str
    record: CallRecord
    num_text_chars: int = 0
    is_text_closed: bool = False
    is_cancelled: bool = False
    is_done: bool = False
    pump: asyncio.Task[None] | None = None
    place: contextlib.AsyncExitStack | None = None  # its caller's place, for an utterance beyond the first
    words: WordTracker | None = None  # with word timestamps
    substitution: StreamingSubstitution | None = None  # with a lexicon


def check_utterance_id(utterance_id: str, field: str = "utterance_id") -> str:
    if len(utterance_id) > MAX_UTTERANCE_ID_CHARS:
        raise invalid(field, f"is {len(utterance_id)} characters; at most {MAX_UTTERANCE_ID_CHARS}")
    if not _UTTERANCE_ID.fullmatch(utterance_id):
        raise invalid(field, "may hold only letters, digits and '-_.:'")
    return utterance_id


class UtteranceCall:
    """The utterances of one call, opened with the call's prepared request as their template."""

    def __init__(self, steps: SpeechSteps, record: CallRecord, caller: str, prepared: PreparedRequest,
                 output: OutputFormat, time_remaining: Callable[[], float | None],
                 word_timestamps_language: str | None = None, lexicon: Lexicon | None = None) -> None:
        self._steps = steps
        self._word_timestamps_language = word_timestamps_language  # None: no word timestamps
        self._lexicon = lexicon
        self._record = record  # the call's, and its first utterance's
        self._caller = caller
        self._prepared = prepared
        self._output = output
        self._time_remaining = time_remaining
        self._utterances: dict[str, _Utterance] = {}
        self._num_open = 0
        self._num_open_chars = 0  # the text of the utterances not yet completed
        self._is_text_ended = False
        self._refused_ids: set[str] = set()  # utterances the client began while the server drained
        # One item in hand at a time from the pumps, so that unread audio stays in the engine's streams.
        self._audio: asyncio.Queue[UtteranceItem | BaseException] = asyncio.Queue(maxsize=1)
        self._acks: asyncio.Queue[UtteranceItem] = asyncio.Queue(maxsize=MAX_UNSENT_ACKS)
        self._ended = asyncio.Event()

    @classmethod
    async def start(cls, steps: SpeechSteps, record: CallRecord, identity: Identity, config: Any,
                    output: OutputFormat, time_remaining: Callable[[], float | None]) -> UtteranceCall:
        """A streamed-text call whose config (a StreamingSynthesizeConfig) has arrived: checked, its voice cloned
        and its lexicon resolved once for all its utterances, and its first utterance opened."""
        language = word_timestamps_language(steps.aligner, config, "config.word_timestamps")
        lexicon = steps.request_lexicon(config, identity.owner)
        prepared = await steps.prepare(record, "", config.voice, config.generation, identity.owner,
                                       is_text_streamed=True)
        call = cls(steps, record, identity.caller, prepared, output, time_remaining, language, lexicon)
        await call.open_first(config.utterance_id)
        return call

    @property
    def max_open(self) -> int:
        return self._steps.config.max_utterances_per_call

    async def open_first(self, utterance_id: str) -> None:
        """Open the call's first utterance, whose request is the call's own."""
        await self._open(check_utterance_id(utterance_id), self._record, self._prepared)

    async def append(self, utterance_id: str, fragment: str) -> None:
        """The next fragment of an utterance's text; text for an id not seen yet opens an utterance."""
        utterance = self._utterances.get(utterance_id)
        if utterance is None:
            if self._steps.state.is_draining or utterance_id in self._refused_ids:
                self._refused_ids.add(check_utterance_id(utterance_id))
                return
            utterance = await self._open_next(utterance_id)
        if utterance.is_cancelled:
            return  # text that was on its way when the client cancelled
        if utterance.is_text_closed:
            raise invalid("utterance_id", f"utterance {utterance_id!r} is closed; open a new one with a new id")
        utterance.num_text_chars += len(fragment)
        self._num_open_chars += len(fragment)
        # A longer utterance is spoken segment by segment (the engine's streamed_segments.py), as a whole text is;
        # the call's open utterances together hold no more, so that a caller pins no more text than its whole-text
        # calls could.
        max_chars = self._steps.config.engine.max_document_chars
        if utterance.num_text_chars > max_chars:
            raise invalid("text", f"the streamed text of utterance {utterance_id!r} exceeds {max_chars} characters "
                                  "(--max-document-chars)")
        if self._num_open_chars > max_chars:
            raise invalid("text", f"the open utterances of this call hold more than {max_chars} characters of text "
                                  "(--max-document-chars); let one complete, or cancel one, first")
        if utterance is self._first:
            self._record.num_text_chars = utterance.num_text_chars
        spoken = fragment if utterance.substitution is None else utterance.substitution.append(fragment)
        self._say(utterance, spoken, fragment)

    def _say(self, utterance: _Utterance, spoken: str, original: str) -> None:
        """Text for the engine (a lexicon may hold some back until it knows how to say it)."""
        if utterance.words is not None:
            utterance.words.add_text(spoken, original)
        if spoken:
            self._engine.append_text(utterance.record.request_id, spoken)

    def close(self, utterance_id: str) -> None:
        utterance = self._known(utterance_id)
        if utterance is not None and not (utterance.is_text_closed or utterance.is_cancelled):
            utterance.is_text_closed = True
            if utterance.substitution is not None:
                self._say(utterance, utterance.substitution.close(), "")
            if utterance.words is not None:
                utterance.words.close_text()
            self._engine.close_text(utterance.record.request_id)

    def cancel(self, utterance_id: str) -> None:
        utterance = self._known(utterance_id)
        if utterance is not None and not (utterance.is_done or utterance.is_cancelled):
            utterance.is_cancelled = True
            self._engine.abort(utterance.record.request_id)

    async def flush(self, utterance_id: str, marker: str) -> None:
        """Answer a flush in order with the audio; waits while MAX_UNSENT_ACKS acks are unsent."""
        await self._acks.put(UtteranceItem(utterance_id, flush_marker=marker))

    def end_text(self) -> None:
        """The client's text has ended (half-close): every open utterance is spoken to its end."""
        self._is_text_ended = True
        for utterance_id in list(self._utterances):
            self.close(utterance_id)
        self._end_if_done()

    async def items(self, reader: asyncio.Task[None]) -> AsyncIterator[UtteranceItem]:
        """The call's output in order: audio of the utterances not cancelled, their completions, flush acks. Ends
        once the text has ended and every utterance has completed; raises what failed an utterance, or what
        ended `reader` (the door's task that reads the client's messages) with an error, as soon as it does; and
        UNAVAILABLE once the server drains and every utterance has completed (see the module's docstring)."""
        audio = asyncio.ensure_future(self._audio.get())
        ack = asyncio.ensure_future(self._acks.get())
        ended = asyncio.ensure_future(self._ended.wait())
        draining = asyncio.ensure_future(self._steps.state.wait_draining())
        watched: set[asyncio.Future[Any]] = {audio, ack, ended, reader, draining}
        try:
            while not (ended.done() and self._is_drained(audio)):
                done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
                watched -= done
                if draining in done:
                    self._wind_down()
                if reader in done:
                    reader.result()  # a protocol error ends the call at once; the end of the text just ends reading
                if ack in done:
                    yield ack.result()
                    ack = asyncio.ensure_future(self._acks.get())
                    watched.add(ack)
                if audio in done:
                    item = audio.result()
                    if isinstance(item, BaseException):
                        raise item
                    if item.summary is not None or not self._utterances[item.utterance_id].is_cancelled:
                        yield item
                    audio = asyncio.ensure_future(self._audio.get())
                    watched.add(audio)
        finally:
            for future in (audio, ack, ended, draining):
                future.cancel()
            await asyncio.gather(audio, ack, ended, draining, return_exceptions=True)
        if not self._is_text_ended:
            refused = f" (not spoken: utterance {', '.join(map(repr, sorted(self._refused_ids)))})" \
                if self._refused_ids else ""
            raise ApiError(grpc.StatusCode.UNAVAILABLE, "the server is shutting down: this call's utterances have "
                                                        f"been spoken{refused}; open a new call for the next")

    def _wind_down(self) -> None:
        """The server drains: utterances that have had no text are cancelled; the call ends after the rest."""
        for utterance_id, utterance in self._utterances.items():
            if utterance.num_text_chars == 0 and not (utterance.is_text_closed or utterance.is_done):
                self.cancel(utterance_id)
        self._end_if_done()

    def _is_drained(self, audio: asyncio.Future[Any]) -> bool:
        """Every item has been handed out: pumps put each item before their utterance counts as done."""
        return self._audio.empty() and not audio.done() and self._acks.empty()

    async def aclose(self) -> None:
        """End the call: abort every utterance still running and stop its pump."""
        for utterance in self._utterances.values():
            if not utterance.is_done:
                self._engine.abort(utterance.record.request_id)
        pumps = [utterance.pump for utterance in self._utterances.values() if utterance.pump is not None]
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for utterance in self._utterances.values():
            await self._release(utterance, "CANCELLED")

    @property
    def _engine(self) -> Any:
        return self._steps.engine_or_unavailable()

    @property
    def _first(self) -> _Utterance | None:
        return next(iter(self._utterances.values()), None)

    def _known(self, utterance_id: str) -> _Utterance | None:
        """The utterance by its id; None for one begun while the server drained (never opened)."""
        utterance = self._utterances.get(utterance_id)
        if utterance is None and utterance_id not in self._refused_ids:
            raise invalid("utterance_id", f"no utterance {utterance_id!r} has been opened on this call")
        return utterance

    async def _open_next(self, utterance_id: str) -> _Utterance:
        check_utterance_id(utterance_id)
        if self._num_open >= self.max_open:
            raise invalid("utterance_id", f"opening utterance {utterance_id!r} would make {self.max_open + 1} "
                                          f"open on this call, more than the server's limit of {self.max_open} "
                                          "(--max-utterances-per-call); close or cancel one first")
        record = CallRecord(self._record.rpc, uuid.uuid4().hex, self._record.http_route)
        prepared = dataclasses.replace(self._prepared, request_id=record.request_id)
        place = contextlib.AsyncExitStack()
        await place.enter_async_context(self._steps.calls.track(self._caller))
        try:
            return await self._open(utterance_id, record, prepared, place)
        except BaseException:
            await place.aclose()
            raise

    async def _open(self, utterance_id: str, record: CallRecord, prepared: PreparedRequest,
                    place: contextlib.AsyncExitStack | None = None) -> _Utterance:
        stream = await self._steps.submit(prepared, record, self._time_remaining(), is_text_open=True)
        utterance = _Utterance(utterance_id, record, place=place)
        if self._lexicon is not None:
            utterance.substitution = StreamingSubstitution(self._lexicon)
        if self._word_timestamps_language is not None:
            utterance.words = self._steps.word_tracker(self._word_timestamps_language,
                                                       mapping=utterance.substitution)
        self._utterances[utterance_id] = utterance
        self._num_open += 1
        audio = self._steps.encoded_audio(stream, self._output, record, utterance.words)
        utterance.pump = asyncio.create_task(self._pump(utterance, audio), name=f"utterance {utterance_id}")
        return utterance

    async def _pump(self, utterance: _Utterance, audio: AsyncIterator[EncodedAudio]) -> None:
        """The utterance's audio into the call's output, one item at a time; its end frees its place."""
        try:
            async for piece in audio:
                if piece.summary is not None:
                    is_cancelled = utterance.is_cancelled and piece.summary.finish_reason is FinishReason.ABORTED
                    if utterance.is_cancelled:  # the encoder's tail belongs to audio that was dropped
                        piece = EncodedAudio(None, piece.summary, piece.words)
                    await self._audio.put(UtteranceItem(utterance.utterance_id, piece, is_cancelled=is_cancelled))
                    await self._finish(utterance, "CANCELLED" if is_cancelled else "OK")
                    return
                if not utterance.is_cancelled:
                    await self._audio.put(UtteranceItem(utterance.utterance_id, piece))
        except Exception as error:  # the call ends with it, as with any failure of its steps
            await self._audio.put(error)

    async def _finish(self, utterance: _Utterance, status: str) -> None:
        utterance.is_done = True
        self._num_open -= 1
        self._num_open_chars -= utterance.num_text_chars
        await self._release(utterance, status)
        self._end_if_done()

    async def _release(self, utterance: _Utterance, status: str) -> None:
        """An utterance beyond the first gives back its caller's place and is observed as a request of its own."""
        place, utterance.place = utterance.place, None
        if place is None:
            return
        await place.aclose()
        self._steps.forget_request(utterance.record.request_id)
        if self._steps.metrics is not None:
            self._steps.metrics.observe_call(utterance.record, status)

    def _end_if_done(self) -> None:
        if (self._is_text_ended or self._steps.state.is_draining) and self._num_open == 0:
            self._ended.set()
