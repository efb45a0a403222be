"""StreamingSynthesize's two directions once its config has arrived.

The client's messages become operations on the call's utterances (`utterances.UtteranceCall`): text, flush,
close and cancel, each for the utterance it names. The utterances' items (audio, completions, flush acks) go back
as response messages in the order they arose, each taken only when gRPC can send it, so that a client that stops
reading pauses its requests and one that floods flushes is held back by gRPC's flow control. The call's time
limits (idle text, whole stream) are enforced here; the WebSocket door reads its messages through the same
`next_message`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from qwen3_tts.v1.protocol import tts_pb2
from tts_service.api.call_limits import call_too_long_error, idle_error, next_message
from tts_service.api.config import ServerConfig
from tts_service.api.errors import invalid
from tts_service.api.messages import word_timings
from tts_service.api.utterances import UtteranceCall, UtteranceItem, check_utterance_id

pb: Any = tts_pb2


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


class TextCall:
    """One bidirectional call whose first utterance the engine has taken, with its text still open."""

    def __init__(self, config: ServerConfig, utterances: UtteranceCall, started: float,
                 completion: Callable[[Any], Any]) -> None:
        self._config = config
        self._utterances = utterances
        self._started = started  # time.monotonic() when the call began: the stream limit counts from there
        self._completion = completion  # a SynthesisSummary -> its Completion message

    async def responses(self, request_iterator: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """The call's response messages. Ends with the last utterance's completion, or raises the error that
        ends the call."""
        reader = asyncio.create_task(self._read(request_iterator))
        try:
            async for item in self._utterances.items(reader):
                yield self._message(item)
        finally:
            reader.cancel()
            await self._utterances.aclose()
            # The call's outcome is decided; a reader error that lost the race to it is dropped here.
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, request_iterator: AsyncIterator[Any]) -> None:
        """Request messages -> the utterances, until half-close. A protocol error ends this task with the error,
        which ends the call at once."""
        utterances = self._utterances
        while (message := await next_message(request_iterator, self._config, self._started)) is not None:
            kind = message.WhichOneof("request")
            utterance_id = check_utterance_id(message.utterance_id)
            if kind == "text":
                await utterances.append(utterance_id, message.text)
            elif kind == "flush":
                await utterances.flush(utterance_id, message.flush.marker)
            elif kind == "close_utterance":
                utterances.close(utterance_id)
            elif kind == "cancel_utterance":
                utterances.cancel(utterance_id)
            elif kind == "config":
                raise invalid("config", "only the first message may carry the config")
            else:
                raise invalid("request", "every message after the config carries text, a flush, close_utterance "
                                         "or cancel_utterance")
        utterances.end_text()

    def _message(self, item: UtteranceItem) -> Any:
        message = pb.StreamingSynthesizeResponse(utterance_id=item.utterance_id)
        if item.flush_marker is not None:
            message.flush_ack.marker = item.flush_marker
            return message
        assert item.audio is not None
        if item.audio.chunk is not None:
            message.chunk.CopyFrom(item.audio.chunk)
        if item.audio.words:
            message.words.words.extend(word_timings(item.audio.words))
        summary = item.summary
        if summary is not None:
            message.completion.CopyFrom(self._completion(summary))
            if item.is_cancelled:
                message.completion.finish_reason = pb.FINISH_REASON_CANCELLED
            elif message.completion.finish_reason == pb.FINISH_REASON_ABORTED:
                # Not the client (it would be gone or have cancelled) nor a protocol error (reported first).
                raise call_too_long_error(self._config)
        return message
