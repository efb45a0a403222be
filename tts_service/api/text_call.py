"""StreamingSynthesize's two directions once its config has arrived.

The client's messages become the engine's open text (a reader task, which also answers flushes),
and audio messages and flush acks go back in the order they arose. Each of them is taken only
when gRPC can send it: audio left in the engine's stream is what pauses a request whose client
stops reading, and a full queue of unsent acks stops the reading, so that gRPC's flow control
holds back a client that floods flushes. The call's time limits (idle text, whole stream) are
enforced here too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc

from observability.calls import CallRecord
from qwen3_tts.v1.protocol import tts_pb2
from tts_service.api.config import ServerConfig
from tts_service.api.errors import ApiError, invalid
from tts_service.engine import EngineDoor

pb: Any = tts_pb2
# Flush acks a call may hold unsent before the server stops reading its messages.
MAX_UNSENT_FLUSH_ACKS = 64


async def first_config(request_iterator: AsyncIterator[Any], config: ServerConfig) -> Any:
    """The call's first message, which must carry the config and only the config."""
    try:
        first = await asyncio.wait_for(anext(request_iterator), config.stream_idle_timeout_seconds)
    except StopAsyncIteration:
        raise invalid("config", "the request stream ended before its first message, the config") from None
    except TimeoutError:
        raise idle_error(config) from None
    if first.WhichOneof("request") != "config":
        raise invalid("config", "the first message must carry the config (voice, audio format, generation), "
                                "and only the config")
    return first.config


def idle_error(config: ServerConfig) -> ApiError:
    return ApiError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no text arrived for "
                    f"{config.stream_idle_timeout_seconds:g} s; send text more often or close the stream")


def call_too_long_error(config: ServerConfig) -> ApiError:
    return ApiError(grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the call ran past the server's limit of {config.max_stream_seconds:g} s (--max-stream-seconds)")


class TextCall:
    """One bidirectional call whose request the engine has taken, with its text still open."""

    def __init__(self, config: ServerConfig, engine: EngineDoor, record: CallRecord, started: float) -> None:
        self._config = config
        self._engine = engine
        self._record = record
        self._started = started  # time.monotonic() when the call began: the stream limit counts from there
        self._acks: asyncio.Queue[Any] = asyncio.Queue(maxsize=MAX_UNSENT_FLUSH_ACKS)

    async def responses(self, request_iterator: AsyncIterator[Any],
                        audio: AsyncGenerator[Any, None]) -> AsyncIterator[Any]:
        """The call's response messages: `audio` (the request's audio messages, the last with the completion)
        merged with flush acks. Ends with the completion, or raises the error that ends the call."""
        reader = asyncio.create_task(self._read_text(request_iterator))
        try:
            async for message in self._merged(audio, reader):
                yield message
        finally:
            reader.cancel()
            self._engine.abort(self._record.request_id)
            # The call's outcome is decided; a reader error that lost the race to it is dropped here.
            await asyncio.gather(reader, return_exceptions=True)

    async def _read_text(self, request_iterator: AsyncIterator[Any]) -> None:
        """Request messages -> the engine's open text, until half-close. A protocol error ends this task with
        the error; the merge raises it at once, which ends the call and aborts its request."""
        config, engine, record = self._config, self._engine, self._record
        request_id = record.request_id
        while True:
            remaining_s = config.max_stream_seconds - (time.monotonic() - self._started)
            if remaining_s <= 0:
                raise call_too_long_error(config)
            timeout = min(config.stream_idle_timeout_seconds, remaining_s)
            try:
                message = await asyncio.wait_for(anext(request_iterator), timeout)
            except StopAsyncIteration:
                engine.close_text(request_id)
                return
            except TimeoutError:
                raise (idle_error(config) if timeout < remaining_s else call_too_long_error(config)) from None
            kind = message.WhichOneof("request")
            if kind == "text":
                record.num_text_chars += len(message.text)
                if record.num_text_chars > config.engine.max_text_chars:
                    raise invalid("text", f"the streamed text exceeds {config.engine.max_text_chars} characters")
                engine.append_text(request_id, message.text)
            elif kind == "flush":
                await self._acks.put(pb.StreamingSynthesizeResponse(flush_ack=pb.FlushAck(marker=message.flush.marker)))
            elif kind == "config":
                raise invalid("config", "only the first message may carry the config")
            else:
                raise invalid("request", "every message after the config carries text or a flush")

    async def _merged(self, audio: AsyncGenerator[Any, None], reader: asyncio.Task[None]) -> AsyncIterator[Any]:
        """Audio messages and flush acks, each taken when the previous one has been sent. An error of the
        reader ends the call (checked first: the request's abort follows it)."""
        next_audio: asyncio.Future[Any] = asyncio.ensure_future(anext(audio))
        next_ack: asyncio.Future[Any] = asyncio.ensure_future(self._acks.get())
        watched: set[asyncio.Future[Any]] = {next_audio, next_ack, reader}
        try:
            while True:
                done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
                if reader in done:
                    watched.discard(reader)
                    reader.result()  # raises the reader's error; a half-close just ends the reading
                if next_ack in done:
                    yield next_ack.result()
                    watched.discard(next_ack)
                    next_ack = asyncio.ensure_future(self._acks.get())
                    watched.add(next_ack)
                if next_audio in done:
                    message = next_audio.result()
                    if message.HasField("completion") and message.completion.finish_reason == pb.FINISH_REASON_ABORTED:
                        # Not the client (it would be gone) nor a protocol error (reported first): the time limit.
                        raise call_too_long_error(self._config)
                    yield message
                    if message.HasField("completion"):
                        return
                    watched.discard(next_audio)
                    next_audio = asyncio.ensure_future(anext(audio))
                    watched.add(next_audio)
        finally:
            next_audio.cancel()
            next_ack.cancel()
            # The audio generator may be inside a step in its task: let that task end before closing it.
            await asyncio.gather(next_audio, next_ack, return_exceptions=True)
            await audio.aclose()
