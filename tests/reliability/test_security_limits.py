"""Security: API keys never reach the logs, no request field reaches the file system, and the limit on a
stream's duration is enforced. (TLS, mutual TLS and the API-key check itself: tests/service/test_security.py;
limits on text, reference audio and message size: test_errors.py, test_voice_clone.py, test_hostile_input.py.)"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from clients.qwen3_tts_client import Connection, Generation, TtsClient, Voice
from tests.service.helpers import RYAN, RunningServer, start_server, wait_until
from tests.service.processes import server_process
from tts_service.model.checkpoint import LoadedModel

SHORT = Generation(temperature=0.0, max_audio_seconds=0.16)
GOOD_KEY = "k3y-that-must-never-be-logged-4a1f"
WRONG_KEY = "wr0ng-key-that-must-never-be-logged-9c2e"

_watched_directory: list[str] = []
_opened_in_watched: list[str] = []


def _record_opens(event: str, args: tuple[Any, ...]) -> None:
    """An audit hook (it cannot be removed): notes every file opened under the watched directory."""
    if event == "open" and _watched_directory and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if path.startswith(_watched_directory[0]):
            _opened_in_watched.append(path)


sys.addaudithook(_record_opens)


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[Path]:
    """A directory of files that a request names; any open() of them in this process is recorded."""
    (tmp_path / "voice.wav").write_bytes(b"RIFF")
    (tmp_path / "speaker.pt").write_bytes(b"\x00")
    _watched_directory[:] = [str(tmp_path)]
    (tmp_path / "voice.wav").read_bytes()
    assert _opened_in_watched == [str(tmp_path / "voice.wav")], "the audit hook sees opens"
    _opened_in_watched.clear()
    yield tmp_path
    _watched_directory.clear()


@pytest.fixture(scope="module")
def server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(tiny_models["custom_voice"], max_stream_seconds=1.0, stream_idle_timeout_seconds=5.0,
                           max_audio_seconds=4.0)
    yield running
    running.stop()


def test_no_request_field_makes_the_server_open_a_file(server: RunningServer, watched: Path) -> None:
    paths = [str(watched / "voice.wav"), f"file://{watched / 'speaker.pt'}", str(watched / ".." / watched.name)]
    with server.client() as client:
        for path in paths:
            attempts = [
                lambda p=path: client.synthesize(p, RYAN, generation=SHORT),
                lambda p=path: client.synthesize("Hi.", Voice(speaker=p), generation=SHORT),
                lambda p=path: client.synthesize("Hi.", Voice(speaker="ryan", language=p), generation=SHORT),
                lambda p=path: client.synthesize("Hi.", Voice(speaker="ryan", instruction=p), generation=SHORT),
                lambda p=path: client.synthesize("Hi.", Voice(reference_audio=p.encode(), reference_text=p,
                                                               x_vector_only=True), generation=SHORT),
                lambda p=path: list(client.streaming_synthesize([p], RYAN, generation=SHORT)),
            ]
            for attempt in attempts:
                try:
                    attempt()
                except grpc.RpcError as error:
                    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert wait_until(lambda: server.engine.num_live_requests == 0)
    assert _opened_in_watched == []


def test_a_stream_is_ended_at_the_servers_duration_limit_even_while_text_keeps_coming(
        server: RunningServer) -> None:
    def slow_text() -> Iterator[str]:
        for _ in range(10):
            yield "more "
            time.sleep(0.3)

    started = time.monotonic()
    with server.client() as client, pytest.raises(grpc.RpcError) as caught:
        list(client.streaming_synthesize(slow_text(), RYAN, generation=Generation(max_audio_seconds=4.0)))
    assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "limit of 1 s" in caught.value.details()
    assert time.monotonic() - started < 2.5
    assert wait_until(lambda: server.engine.num_live_requests == 0)


def test_api_keys_right_or_wrong_never_reach_the_servers_log(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"{GOOD_KEY}\n")
    with server_process(tmp_path, "--api-keys-file", str(keys), "--log-level", "DEBUG",
                        "--max-audio-seconds", "0.16") as server:
        with TtsClient(Connection(target=server.target, api_key=WRONG_KEY)) as client, \
                pytest.raises(grpc.RpcError) as refused:
            client.synthesize("Hi.", RYAN)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert WRONG_KEY not in refused.value.details()
        with TtsClient(Connection(target=server.target, api_key=GOOD_KEY)) as client:
            assert client.synthesize("Hi.", RYAN).audio
        log = server.log_text()
    assert "api_keys" in log  # the configuration was logged, with the keys redacted
    assert GOOD_KEY not in log and WRONG_KEY not in log
