"""The asyncio client: every RPC, with text fed from an async generator as an LLM would produce it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from clients.qwen3_tts_client import AsyncTtsClient, AudioFormat, Connection, Flush
from tests.service.helpers import GREEDY, RYAN, SAMPLES_PER_FRAME, RunningServer


async def tokens() -> AsyncIterator[str | Flush]:
    for token in ["Hel", "lo", " there", Flush("mid"), ",", " friend", "."]:
        await asyncio.sleep(0.01)
        yield token


def test_the_async_client_calls_every_rpc(custom_voice_server: RunningServer) -> None:
    async def scenario() -> None:
        async with AsyncTtsClient(Connection(target=custom_voice_server.target)) as client:
            assert "ryan" in {speaker.name for speaker in (await client.list_voices()).speakers}
            whole = await client.synthesize("Hello there, friend.", RYAN, AudioFormat("pcm16"), GREEDY)
            assert len(whole.audio) == 2 * whole.completion.usage.audio_frames * SAMPLES_PER_FRAME
            online = [response async for response in client.synthesize_online("Hello.", RYAN, generation=GREEDY)]
            assert online[-1].HasField("completion")
            streamed = [response async for response in client.streaming_synthesize(tokens(), RYAN,
                                                                                   AudioFormat("pcm16"), GREEDY)]
            assert [r.flush_ack.marker for r in streamed if r.HasField("flush_ack")] == ["mid"]
            assert streamed[-1].completion.usage.input_tokens == whole.completion.usage.input_tokens
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await client.synthesize("", RYAN)
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    asyncio.run(scenario())
