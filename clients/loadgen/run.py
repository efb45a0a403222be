"""Sending the planned requests on schedule and timing what comes back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import grpc

from clients.loadgen.schedule import PlannedRequest, text_fragments
from clients.qwen3_tts_client import AsyncTtsClient, AudioFormat, Generation, Voice
from observability.playback import ChunkArrival, Stalls, stalls


@dataclass(frozen=True)
class RequestSettings:
    voice: Voice
    audio_format: AudioFormat
    generation: Generation  # max_audio_seconds comes from each planned request
    fragment_interval_s: float  # StreamingSynthesize: pause between text fragments
    timeout_s: float
    word_timestamps: bool = False


@dataclass(frozen=True)
class RequestRecord:
    index: int
    rpc: str
    language: str
    text_chars: int
    scheduled_s: float
    start_lag_s: float  # how late the generator sent it
    finished_s: float  # after the run's start (sent at scheduled_s + start_lag_s), whatever the status
    status: str  # "OK" or the gRPC status code's name
    time_to_first_audio_s: float | None
    end_to_end_s: float | None
    audio_s: float
    realtime_factor: float | None
    num_chunks: int
    stalls: Stalls  # of a player that starts at the first chunk and pauses whenever it runs out of audio
    finish_reason: str
    # With word timestamps: for each message of words, how long after the audio of its last word had arrived, and how
    # much audio past that word's end the listener already had when it came (a word the aligner placed early in its
    # sentence's audio has a long lag that is that audio's head start, not a late message).
    word_lags_s: tuple[float, ...] = ()
    word_audio_ahead_s: tuple[float, ...] = ()


async def run_schedule(client: AsyncTtsClient, planned: list[PlannedRequest], settings: RequestSettings,
                       start_at: float | None = None) -> list[RequestRecord]:
    """Each planned request sent at its time after `start_at` (on the loop's clock, time.monotonic; default now)."""
    loop = asyncio.get_running_loop()
    run_start = loop.time() if start_at is None else start_at

    async def at_its_time(request: PlannedRequest) -> RequestRecord:
        await asyncio.sleep(max(0.0, run_start + request.start_s - loop.time()))
        lag = loop.time() - run_start - request.start_s
        return await timed_request(client, request, settings, lag)

    return list(await asyncio.gather(*(at_its_time(request) for request in planned)))


async def run_closed_loop(client: AsyncTtsClient, planned: list[PlannedRequest], settings: RequestSettings,
                          concurrency: int) -> list[RequestRecord]:
    """Keep `concurrency` requests in flight, in plan order: each is sent as soon as an earlier one ends. Its
    record's scheduled time is when it was sent, so it has no lag."""
    if concurrency <= 0:
        raise ValueError("concurrency must be > 0")
    loop = asyncio.get_running_loop()
    run_start = loop.time()
    slots = asyncio.Semaphore(concurrency)

    async def when_a_slot_frees(request: PlannedRequest) -> RequestRecord:
        async with slots:
            sent = replace(request, start_s=loop.time() - run_start)
            return await timed_request(client, sent, settings, 0.0)

    # gather starts the tasks in plan order, and the semaphore wakes its waiters in that order.
    return list(await asyncio.gather(*(when_a_slot_frees(request) for request in planned)))


async def timed_request(client: AsyncTtsClient, request: PlannedRequest, settings: RequestSettings,
                        start_lag_s: float) -> RequestRecord:
    generation = replace(settings.generation, max_audio_seconds=request.max_audio_seconds,
                         seed=(settings.generation.seed or 0) + request.index)
    voice = replace(settings.voice, language=request.language)
    started = time.perf_counter()
    first_text_sent: list[float] = []
    if request.rpc == "online":
        first_text_sent.append(started)
        call = client.synthesize_online(request.text, voice, settings.audio_format, generation,
                                        timeout=settings.timeout_s, word_timestamps=settings.word_timestamps)
    else:
        call = client.streaming_synthesize(_paced(text_fragments(request.text), settings.fragment_interval_s,
                                                  first_text_sent),
                                           voice, settings.audio_format, generation,
                                           timeout=settings.timeout_s, word_timestamps=settings.word_timestamps)
    arrivals: list[ChunkArrival] = []
    audio_until: list[float] = []  # each chunk's end in the audio, beside `arrivals`
    word_lags: list[float] = []
    audio_ahead: list[float] = []
    completion: Any = None
    status = "OK"
    try:
        async for response in call:
            now = time.perf_counter()
            if response.HasField("chunk") and response.chunk.num_samples > 0:
                arrivals.append(ChunkArrival(now, response.chunk.offset_seconds))
                audio_until.append(response.chunk.offset_seconds + response.chunk.duration_seconds)
            if response.words.words:
                last_word_end_s = response.words.words[-1].end_seconds
                word_lags.append(now - _arrival_of(last_word_end_s, arrivals, audio_until))
                audio_ahead.append(max(0.0, max(audio_until, default=0.0) - last_word_end_s))
            if response.HasField("completion"):
                completion = response.completion
    except grpc.aio.AioRpcError as error:
        status = error.code().name
    ended = time.perf_counter()
    return replace(_record(request, start_lag_s, status, started, first_text_sent, arrivals, completion, ended),
                   word_lags_s=tuple(word_lags), word_audio_ahead_s=tuple(audio_ahead))


def _arrival_of(audio_s: float, arrivals: list[ChunkArrival], audio_until: list[float]) -> float:
    """When the chunk holding the audio at `audio_s` arrived (the last chunk's arrival if none reaches it)."""
    for arrival, until in zip(arrivals, audio_until, strict=True):
        if until >= audio_s - 1e-6:
            return arrival.arrival_s
    return arrivals[-1].arrival_s if arrivals else time.perf_counter()


async def _paced(fragments: list[str], interval_s: float, first_sent: list[float]) -> AsyncIterator[str]:
    for position, fragment in enumerate(fragments):
        if position and interval_s > 0:
            await asyncio.sleep(interval_s)
        if not first_sent:
            first_sent.append(time.perf_counter())
        yield fragment


def _record(request: PlannedRequest, start_lag_s: float, status: str, started: float, first_text_sent: list[float],
            arrivals: list[ChunkArrival], completion: Any, ended: float) -> RequestRecord:
    is_ok = status == "OK"
    audio_s = completion.usage.audio_seconds if completion is not None else 0.0
    first_audio = arrivals[0].arrival_s - first_text_sent[0] if is_ok and arrivals and first_text_sent else None
    end_to_end = ended - started if is_ok else None
    finish_reason = "" if completion is None else \
        type(completion).DESCRIPTOR.fields_by_name["finish_reason"].enum_type.values_by_number[
            completion.finish_reason].name.removeprefix("FINISH_REASON_").lower()
    return RequestRecord(
        index=request.index, rpc=request.rpc, language=request.language, text_chars=len(request.text),
        scheduled_s=request.start_s, start_lag_s=start_lag_s,
        finished_s=request.start_s + start_lag_s + ended - started, status=status,
        time_to_first_audio_s=first_audio, end_to_end_s=end_to_end,
        audio_s=audio_s, realtime_factor=end_to_end / audio_s if end_to_end is not None and audio_s > 0 else None,
        num_chunks=len(arrivals), stalls=stalls(arrivals), finish_reason=finish_reason)
