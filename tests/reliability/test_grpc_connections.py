"""The gRPC ports under clients that open connections and say nothing, held as the HTTP ports hold them: one beyond
--max-grpc-connections is closed as it is accepted, one whose handshake is not done within
--grpc-handshake-timeout-seconds is closed then, and calls are served again once such connections have gone. Before,
gRPC's own defaults (no cap, 120 s for a handshake) let one client hold descriptors without end."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.service.helpers import RunningServer, seconds_until_closed, start_server
from tests.service.processes import free_port
from tts_service.model.checkpoint import LoadedModel

MAX_CONNECTIONS = 3
HANDSHAKE_TIMEOUT_S = 3.0
# A refused connection closes as it is accepted; an admitted one that says nothing waits for the handshake timeout.
AT_ONCE_S = 0.5
# How late past its timeout a connection may close: gRPC's timer, and a busy two-core machine.
CLOSE_MARGIN_S = 1.5


@pytest.fixture(scope="module")
def capped(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    server = start_server(tiny_models["custom_voice"], health_port=free_port(), max_grpc_connections=MAX_CONNECTIONS,
                          grpc_handshake_timeout_seconds=HANDSHAKE_TIMEOUT_S)
    yield server
    server.stop()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def is_serving(port: int) -> bool:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return answer.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("which", ["port", "health_port"])
def test_a_connection_beyond_the_cap_is_closed_at_once_and_calls_are_served_once_the_silent_ones_go(
        capped: RunningServer, which: str) -> None:
    port = getattr(capped.server, which)
    assert port is not None
    silent = [connect(port) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.3)  # all accepted
        with connect(port) as beyond:
            assert seconds_until_closed(beyond) < AT_ONCE_S
    finally:
        for sock in silent:
            sock.close()
    time.sleep(0.3)  # the server has seen them go
    assert is_serving(port)


def test_a_connection_that_never_finishes_its_handshake_is_closed_at_the_timeout(capped: RunningServer) -> None:
    with connect(capped.server.port) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n")  # the start of HTTP/2's preface, never finished
        open_s = seconds_until_closed(sock)
    assert HANDSHAKE_TIMEOUT_S * 0.8 <= open_s < HANDSHAKE_TIMEOUT_S + CLOSE_MARGIN_S
