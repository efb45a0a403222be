"""A streamed call through the real server and its engine core's process: the call's text goes to the core without
waiting for the core to take the request, so a refusal comes back on the request's stream. The call still ends at
once with INVALID_ARGUMENT naming the field while the client's text stays open, and the server serves the next."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from clients.qwen3_tts_client import Generation, Voice
from clients.qwen3_tts_client.client import streaming_config
from qwen3_tts.v1.protocol import tts_pb2, tts_pb2_grpc
from tests.service.processes import server_process

pb: Any = tts_pb2


def held_open(first: list[Any], release: threading.Event) -> Iterator[Any]:
    """`first`, then a request stream that stays open (no half-close) until `release` is set."""
    yield from first
    release.wait(timeout=60)


def test_a_streamed_call_the_engine_core_refuses_ends_at_once_while_its_text_stays_open(tmp_path: Path) -> None:
    with server_process(tmp_path) as server:
        stub = tts_pb2_grpc.TextToSpeechStub(grpc.insecure_channel(server.target))
        release = threading.Event()
        started = time.monotonic()
        try:
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.StreamingSynthesize(held_open([streaming_config(Voice(speaker="nobody")),
                                                         pb.StreamingSynthesizeRequest(text="Hello the")], release),
                                              timeout=60))
        finally:
            release.set()
        assert time.monotonic() - started < 20
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("voice.speaker: unknown speaker")
        served = list(stub.StreamingSynthesize(iter([streaming_config(Voice(speaker="ryan"),
                                                                      generation=Generation(max_audio_seconds=0.48)),
                                                     pb.StreamingSynthesizeRequest(text="Still here.")]),
                                               timeout=60))
        assert served[-1].HasField("completion") and served[-1].completion.usage.audio_frames > 0
