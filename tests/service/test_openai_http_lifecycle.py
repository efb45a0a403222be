"""The OpenAI-compatible HTTP API over TLS and mutual TLS, while the server drains, and past the server's limit on a
call's life: what the gRPC front door is tested for, through the HTTP one."""

from __future__ import annotations

import asyncio
import http.client
import io
import json
import ssl
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import soundfile as sf

from tests.service.certificates import Certificates, issue_certificates, write_certificates
from tests.service.helpers import RunningServer, start_server, wait_until
from tests.service.processes import free_port
from tts_service.model.checkpoint import LoadedModel

SPEECH = {"model": "tts-1", "voice": "ryan", "input": "Hello there.", "response_format": "wav"}


def post_speech(host: str, port: int, body: dict[str, Any], context: ssl.SSLContext | None = None,
                ) -> tuple[int, bytes]:
    """POST /v1/audio/speech over HTTP, or HTTPS with `context`: the status and the body."""
    connection = (http.client.HTTPSConnection(host, port, context=context, timeout=60) if context is not None
                  else http.client.HTTPConnection(host, port, timeout=60))
    try:
        connection.request("POST", "/v1/audio/speech", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def assert_whole_wav(body: bytes) -> None:
    samples, rate = sf.read(io.BytesIO(body))
    assert rate == 24000 and len(samples) > 0


@pytest.fixture(scope="module")
def certificates() -> Certificates:
    return issue_certificates()


def trusting(certificates: Certificates, tmp_path: Path, with_client_certificate: bool = False) -> ssl.SSLContext:
    """A client context that trusts the test CA, with the client's certificate when asked."""
    (tmp_path / "client-ca.pem").write_bytes(certificates.ca.certificate)
    context = ssl.create_default_context(cafile=tmp_path / "client-ca.pem")
    if with_client_certificate:
        (tmp_path / "client.pem").write_bytes(certificates.client.certificate)
        (tmp_path / "client.key").write_bytes(certificates.client.key)
        context.load_cert_chain(tmp_path / "client.pem", tmp_path / "client.key")
    return context


def test_over_tls_the_http_api_serves_clients_that_trust_its_ca_and_refuses_plaintext(
        tiny_models: dict[str, LoadedModel], certificates: Certificates, tmp_path: Path) -> None:
    paths = write_certificates(tmp_path, certificates)
    port = free_port()
    server = start_server(tiny_models["custom_voice"], host="localhost", http_port=port, tls_cert=paths["tls_cert"],
                          tls_key=paths["tls_key"])
    try:
        status, body = post_speech("localhost", port, SPEECH, trusting(certificates, tmp_path))
        assert status == 200
        assert_whole_wav(body)
        with pytest.raises((OSError, http.client.HTTPException)):
            post_speech("localhost", port, SPEECH)  # plaintext to a TLS port gets no answer
    finally:
        server.stop()


def test_with_mutual_tls_the_http_api_requires_a_client_certificate_signed_by_the_client_ca(
        tiny_models: dict[str, LoadedModel], certificates: Certificates, tmp_path: Path) -> None:
    port = free_port()
    server = start_server(tiny_models["custom_voice"], host="localhost", http_port=port,
                          **write_certificates(tmp_path, certificates))
    try:
        status, body = post_speech("localhost", port, SPEECH, trusting(certificates, tmp_path, True))
        assert status == 200
        assert_whole_wav(body)
        with pytest.raises((OSError, http.client.HTTPException)):
            post_speech("localhost", port, SPEECH, trusting(certificates, tmp_path, False))
    finally:
        server.stop()


@pytest.fixture
def slow_http_server(tiny_models: dict[str, LoadedModel], monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningServer]:
    """A server with the HTTP API whose engine takes at least 50 ms a step, so that a call lasts about a second."""
    server = start_server(tiny_models["custom_voice"], http_port=free_port(), max_audio_seconds=1.0,
                          drain_timeout_seconds=30.0, max_stream_seconds=30.0)
    runner = server.engine.runner
    original = runner.start_step

    def slow(step: Any) -> Any:
        time.sleep(0.05)
        return original(step)

    monkeypatch.setattr(runner, "start_step", slow)
    yield server
    server.stop()


def test_draining_refuses_new_http_calls_with_503_and_lets_the_running_one_finish(
        slow_http_server: RunningServer) -> None:
    server, port = slow_http_server, slow_http_server.server.config.http_port
    assert port is not None
    with ThreadPoolExecutor(max_workers=1) as calls:
        running = calls.submit(post_speech, "127.0.0.1", port, SPEECH)
        assert wait_until(lambda: server.engine.num_live_requests == 1)
        drained = asyncio.run_coroutine_threadsafe(server.server.drain(), server.loop)
        assert wait_until(lambda: server.server.state.is_draining)
        status, body = post_speech("127.0.0.1", port, SPEECH)
        assert status == 503
        assert json.loads(body)["error"]["message"] == "the server is shutting down; retry"
        assert not drained.done()  # still waiting for the running call
        status, body = running.result(timeout=30)
    assert status == 200
    samples, _ = sf.read(io.BytesIO(body))
    assert len(samples) > 0
    assert drained.result(timeout=10) is True


def test_a_call_past_the_servers_time_limit_gets_504_in_openais_shape(tiny_models: dict[str, LoadedModel],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    server = start_server(tiny_models["custom_voice"], http_port=port, max_audio_seconds=2.0, max_stream_seconds=0.5)
    runner = server.engine.runner
    original = runner.start_step

    def slow(step: Any) -> Any:
        time.sleep(0.1)  # 25 frames at 0.1 s a step take longer than the 0.5 s limit
        return original(step)

    monkeypatch.setattr(runner, "start_step", slow)
    try:
        # FLAC is sent once complete, so the limit is met before any audio: the answer is an error, not a cut body.
        status, body = post_speech("127.0.0.1", port, {**SPEECH, "response_format": "flac"})
        assert status == 504
        error = json.loads(body)["error"]
        assert (error["type"], error["code"]) == ("server_error", "timeout")
        assert "--max-stream-seconds" in error["message"]
        monkeypatch.undo()
        assert wait_until(lambda: server.engine.num_live_requests == 0, timeout_s=5.0)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/v1/models")
        assert connection.getresponse().status == 200  # and the front door still answers
        connection.close()
    finally:
        server.stop()
