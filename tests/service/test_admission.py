"""RESOURCE_EXHAUSTED: a full queue (with a retry delay) and a request larger than the KV cache (without one)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from clients.qwen3_tts_client import Generation, TtsClient
from tests.service.helpers import RYAN, RunningServer, start_server, wait_until
from tts_service.model.checkpoint import LoadedModel

SHORT = Generation(temperature=0.0, max_audio_seconds=0.4)


@pytest.fixture(scope="module")
def small_server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    # One request at a time, one waiting; 8 KV blocks of 32 positions hold a short request but not 20 s of audio.
    running = start_server(tiny_models["custom_voice"], max_concurrent=1, max_waiting=1, kv_blocks=8,
                           max_audio_seconds=20.0, stream_idle_timeout_seconds=30.0)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def small_client(small_server: RunningServer) -> Iterator[TtsClient]:
    with small_server.client() as tts:
        yield tts


def retry_delay_s(error: grpc.RpcError) -> float | None:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info.retry_delay.ToNanoseconds() / 1e9
    return None


def test_a_full_queue_answers_resource_exhausted_with_a_retry_delay_and_keeps_the_queued(
        small_server: RunningServer, small_client: TtsClient) -> None:
    scheduler = small_server.engine.scheduler
    # The only slot: a long request whose client reads it, so that it keeps running (a stalled one would give
    # its slot to the queued request).
    holder = small_client.synthesize_online("Hold the only slot for a while.", RYAN,
                                            generation=Generation(temperature=0.0, max_audio_seconds=8.0))
    with ThreadPoolExecutor(max_workers=2) as calls:  # a blocking client's stream starts once it is read
        holding = calls.submit(list, holder)
        assert wait_until(lambda: scheduler.num_running == 1)
        queued = calls.submit(list, small_client.synthesize_online("Queued.", RYAN, generation=SHORT))
        assert wait_until(lambda: scheduler.num_waiting == 1)
        with pytest.raises(grpc.RpcError) as caught:
            small_client.synthesize("Refused.", RYAN, generation=SHORT)
        holder.cancel()
        assert queued.result(timeout=30)[-1].completion.usage.audio_frames >= 2
        with pytest.raises(grpc.RpcError):
            holding.result(timeout=30)
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert retry_delay_s(caught.value) == pytest.approx(1.0)


def test_a_request_larger_than_the_kv_cache_is_refused_without_a_retry_delay(small_client: TtsClient) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        small_client.synthesize("Hello.", RYAN, generation=Generation(max_audio_seconds=20.0))
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "generation.max_audio_seconds" in caught.value.details()
    assert retry_delay_s(caught.value) is None
    assert small_client.synthesize("Hello.", RYAN, generation=SHORT).completion.usage.audio_frames >= 2


def test_a_streamed_request_larger_than_the_kv_cache_is_refused_once_its_text_starts(small_client: TtsClient) -> None:
    too_long = Generation(max_audio_seconds=20.0)
    with pytest.raises(grpc.RpcError) as caught:
        list(small_client.streaming_synthesize(["Hello ", "there."], RYAN, generation=too_long))
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
