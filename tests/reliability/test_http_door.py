"""The HTTP door under hostile clients, as hard as the gRPC one: what a hostile test found on it, each now refused at
once or bounded in time. Huge bodies are refused before they are read while health keeps answering; no answer or log
line quotes a long value; a body that is not strict JSON is a 400 (415 for another media type), never a 500;
connections that never finish their head or body, or say nothing, are closed at their timeouts; and the connection
caps hold, per client address and in all, before any key is checked, and over TLS from before the handshake."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.service.certificates import Certificates, issue_certificates, write_certificates
from tests.service.helpers import RunningServer, seconds_until_closed, start_server
from tests.service.processes import free_port
from tts_service.api.http_connections import ACCEPT_ERROR, OncePerInterval, client_address
from tts_service.model.checkpoint import LoadedModel

API_KEY = "door-key"
AUTHORIZED = {"Authorization": f"Bearer {API_KEY}"}
SPEECH = {"model": "tts-1", "voice": "ryan", "input": "Hello.", "response_format": "pcm"}
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
# aiohttp's keep-alive timeout bounds the wait for a whole next head: long enough here that only the header timeout
# can close a head begun after an idle pause longer than it.
KEEPALIVE_TIMEOUT_S = 4.0
# How late past its timeout a connection may close: the loop's timer, and a busy two-core machine.
CLOSE_MARGIN_S = 1.0
LONG = "x" * 100_000
MOST_ANSWER_BYTES = 1000
MOST_LOG_CHARS = 500


@pytest.fixture(scope="module")
def door(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    """A server whose HTTP timeouts are short enough to watch them close connections."""
    server = start_server(tiny_models["custom_voice"], http_port=free_port(), api_keys=frozenset({API_KEY}),
                          http_header_timeout_seconds=HEADER_TIMEOUT_S, http_body_timeout_seconds=BODY_TIMEOUT_S,
                          http_keepalive_timeout_seconds=KEEPALIVE_TIMEOUT_S)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def capped(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    """A server with small connection caps: 4 from one address, 6 in all."""
    server = start_server(tiny_models["custom_voice"], http_port=free_port(), api_keys=frozenset({API_KEY}),
                          max_http_connections=6, max_http_connections_per_address=4)
    yield server
    server.stop()


def http_port(server: RunningServer) -> int:
    port = server.server.config.http_port
    assert port is not None
    return port


def connect(server: RunningServer, source: str = "127.0.0.1", timeout_s: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", http_port(server)), timeout=timeout_s, source_address=(source, 0))


def request_head(content_length: int | None = None, extra: str = "") -> bytes:
    length = "" if content_length is None else f"Content-Length: {content_length}\r\n"
    return (f"POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {API_KEY}\r\n{length}{extra}\r\n").encode()


def post(server: RunningServer, body: bytes, content_type: str = "application/json",
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", http_port(server), timeout=30)
    try:
        connection.request("POST", "/v1/audio/speech", body,
                           {"Content-Type": content_type, **AUTHORIZED, **(headers or {})})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def models_status(connection: http.client.HTTPConnection) -> int:
    connection.request("GET", "/v1/models", headers=AUTHORIZED)
    response = connection.getresponse()
    response.read()
    return response.status


def status_of(sock: socket.socket) -> int:
    """The status of the next response on `sock`."""
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status


@contextlib.contextmanager
def trickling(sock: socket.socket) -> Iterator[None]:
    """Sends one byte every 0.2 s on `sock` from a thread, until the block ends or the server hangs up."""
    stop = threading.Event()

    def trickle() -> None:
        with contextlib.suppress(OSError):
            while not stop.wait(0.2):
                sock.send(b"x")

    thread = threading.Thread(target=trickle, name="test-trickle", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def health_latency_s(channel: grpc.Channel) -> float:
    started = time.monotonic()
    answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    return time.monotonic() - started


# -- bodies --------------------------------------------------------------------------------------------------------


def test_30_mb_bodies_are_refused_with_413_before_they_are_read_while_health_keeps_answering(
        door: RunningServer) -> None:
    body = b'{"input": [' + b"0," * 15_000_000 + b"0]}"
    sockets = [connect(door) for _ in range(3)]
    try:
        for sock in sockets:
            started = time.monotonic()
            sock.sendall(request_head(len(body)))
            assert status_of(sock) == 413
            assert time.monotonic() - started < 0.5
        with ThreadPoolExecutor(max_workers=3) as senders, grpc.insecure_channel(door.target) as channel:
            sending = [senders.submit(send_ignoring_hangup, sock, body) for sock in sockets]
            latencies = [health_latency_s(channel)]
            while not all(future.done() for future in sending):
                latencies.append(health_latency_s(channel))
    finally:
        for sock in sockets:
            sock.close()
    assert max(latencies) < 0.1


def send_ignoring_hangup(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:  # the server hung up on the body it refused
        return


def test_a_chunked_body_is_cut_at_the_limit_with_413(door: RunningServer) -> None:
    chunk = b"x" * 65536
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(64))  # 4 MiB, twice the limit
    with connect(door) as sock:
        sock.sendall(request_head(extra="Transfer-Encoding: chunked\r\n") + chunks)
        assert status_of(sock) == 413


def test_no_answer_or_log_line_quotes_a_long_value(door: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    hostile = [{**SPEECH, "model": LONG}, {**SPEECH, "response_format": LONG}, {**SPEECH, "stream_format": LONG},
               {**SPEECH, "speed": LONG}, {**SPEECH, "voice": LONG}, {**SPEECH, "voice": {"id": LONG}},
               {**SPEECH, "instructions": LONG}, {**SPEECH, "input": LONG},
               {**SPEECH, "model": "whisper-1", LONG: LONG, "extra": LONG}]
    with caplog.at_level(logging.DEBUG):
        answers = [post(door, json.dumps(body).encode()) for body in hostile]
    assert [status for status, _ in answers] == [404, 400, 400, 400, 400, 400, 400, 400, 404]
    assert max(len(answer) for _, answer in answers) < MOST_ANSWER_BYTES
    assert max(len(record.getMessage()) for record in caplog.records) < MOST_LOG_CHARS


@pytest.mark.parametrize("head", [
    b"GET /v1/models HTTP/1.1\r\nHost: test\r\nX-Bad: " + b"\x01" * 5000 + b"\r\n\r\n",
    b"GET /" + b"A" * 5000 + b" HTTP/1.1\x01\r\n\r\n",
    b"BAD\x01" + b"Z" * 5000 + b" / HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: test\r\n" + b"Q" * 5000 + b"\r\n\r\n"], ids=["value", "line", "method", "name"])
def test_the_400_for_a_head_that_does_not_parse_quotes_none_of_it(door: RunningServer, head: bytes) -> None:
    """aiohttp's own answer quoted the offending line back, up to 8 KiB escaped."""
    with connect(door) as sock:
        sock.sendall(head)
        response = http.client.HTTPResponse(sock)
        response.begin()
        body = response.read()
    assert response.status == 400
    assert body == b"400 Bad Request: the request head does not parse as HTTP/1.1"


def test_a_body_that_is_not_json_in_utf_8_is_refused_with_415(door: RunningServer) -> None:
    body = json.dumps(SPEECH).encode()
    refusals = [post(door, body, "text/plain"), post(door, body, "application/json; charset=latin-1"),
                post(door, body, headers={"Content-Encoding": "gzip"})]
    assert [status for status, _ in refusals] == [415, 415, 415]
    assert {json.loads(answer)["error"]["code"] for _, answer in refusals} == {"unsupported_media_type"}
    assert post(door, body, "application/json; charset=UTF-8")[0] == 200


def test_bodies_that_are_not_strict_json_are_a_400_naming_the_body_never_a_500(door: RunningServer) -> None:
    valid = json.dumps(SPEECH)[:-1]  # the object, open for one more member
    bodies = [b'{"model": ', b'{"input": "\xff\xfe"}', f'{valid}, "input": "\\ud800"}}'.encode(),
              f'{valid}, "extra": ["\\udfff"]}}'.encode(), f'{valid}, "\\ud800": 1}}'.encode(),
              b"[" * 10_000 + b"]" * 10_000, f'{valid}, "extra": {"[" * 9}{"]" * 9}}}'.encode(),
              f'{valid}, "extra": NaN}}'.encode()]
    answers = [post(door, body) for body in bodies]
    assert [status for status, _ in answers] == [400] * len(bodies)
    assert {json.loads(answer)["error"]["param"] for _, answer in answers} == {"body"}


# -- slow and silent connections -------------------------------------------------------------------------------------


@pytest.mark.parametrize("is_kept_alive", [False, True], ids=["new connection", "kept alive past the timeout"])
def test_a_request_head_sent_a_byte_at_a_time_is_closed_at_the_header_timeout(door: RunningServer,
                                                                             is_kept_alive: bool) -> None:
    """The timeout runs from a head's first byte: a connection idle between requests for longer is not cut by it
    (that is the keep-alive timeout's), and its next head has the same time as a new connection's first."""
    connection = http.client.HTTPConnection("127.0.0.1", http_port(door), timeout=10)
    connection.connect()
    if is_kept_alive:
        assert models_status(connection) == 200
        time.sleep(HEADER_TIMEOUT_S * 1.5)
    sock = connection.sock
    assert sock is not None
    with contextlib.closing(connection):
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nX-Slow: ")
        with trickling(sock):
            open_s = seconds_until_closed(sock)
    assert HEADER_TIMEOUT_S * 0.9 <= open_s < HEADER_TIMEOUT_S + CLOSE_MARGIN_S


def test_a_body_sent_a_byte_at_a_time_gets_408_and_is_closed_at_the_body_timeout(door: RunningServer) -> None:
    with connect(door) as sock:
        sock.sendall(request_head(1000) + b'{"input": "')
        started = time.monotonic()
        with trickling(sock):
            status = status_of(sock)
            open_s = time.monotonic() - started + seconds_until_closed(sock)
    assert status == 408
    assert BODY_TIMEOUT_S * 0.9 <= open_s < BODY_TIMEOUT_S + CLOSE_MARGIN_S


def test_a_connection_that_says_nothing_is_closed_at_the_keepalive_timeout(door: RunningServer) -> None:
    with connect(door) as sock:
        open_s = seconds_until_closed(sock)
    assert KEEPALIVE_TIMEOUT_S * 0.9 <= open_s < KEEPALIVE_TIMEOUT_S + CLOSE_MARGIN_S


# -- connection caps -------------------------------------------------------------------------------------------------


def served(server: RunningServer, source: str) -> http.client.HTTPConnection:
    """A kept-alive connection from `source` that has been served one request."""
    connection = http.client.HTTPConnection("127.0.0.1", http_port(server), timeout=10, source_address=(source, 0))
    assert models_status(connection) == 200
    return connection


def is_closed_at_once(server: RunningServer, source: str) -> bool:
    with connect(server, source, timeout_s=2.0) as sock:
        try:
            return sock.recv(1) == b""
        except ConnectionResetError:
            return True


def hang_up(connection: http.client.HTTPConnection) -> None:
    """Close `connection` and wait for the server's side to close too: by then it no longer counts it."""
    sock = connection.sock
    assert sock is not None
    sock.shutdown(socket.SHUT_WR)
    seconds_until_closed(sock)
    connection.close()


def test_connections_beyond_the_cap_for_one_address_are_closed_at_once_and_the_others_stay_served(
        capped: RunningServer) -> None:
    allowed = [served(capped, "127.0.0.1") for _ in range(4)]
    assert [is_closed_at_once(capped, "127.0.0.1") for _ in range(5)] == [True] * 5
    assert [models_status(connection) for connection in allowed] == [200] * 4
    hang_up(served(capped, "127.0.0.2"))  # another address has places of its own
    for connection in allowed:
        hang_up(connection)
    assert post(capped, json.dumps(SPEECH).encode())[0] == 200


def test_connections_beyond_the_cap_in_all_are_closed_at_once_whatever_their_address(capped: RunningServer) -> None:
    allowed = [served(capped, "127.0.0.1") for _ in range(4)] + [served(capped, "127.0.0.2") for _ in range(2)]
    assert is_closed_at_once(capped, "127.0.0.3")
    assert [models_status(connection) for connection in allowed] == [200] * 6
    hang_up(allowed.pop())
    hang_up(served(capped, "127.0.0.3"))
    for connection in allowed:
        hang_up(connection)


def test_an_ipv6_client_counts_as_its_whole_64_and_an_ipv4_mapped_one_as_its_ipv4_address() -> None:
    assert client_address(("2001:db8::1", 1, 0, 0)) == client_address(("2001:db8::ab:1", 2, 0, 0)) == "2001:db8::/64"
    assert client_address(("2001:db8:0:1::1", 1, 0, 0)) == "2001:db8:0:1::/64"
    assert client_address(("::ffff:10.0.0.1", 1, 0, 0)) == client_address(("10.0.0.1", 2)) == "10.0.0.1"


# -- what hostile clients make the server log ------------------------------------------------------------------------


def test_a_failing_accept_is_logged_once_per_interval_saying_how_many_were_held_back(
        caplog: pytest.LogCaptureFixture) -> None:
    now = 0.0
    logger = logging.getLogger("test_http_door.accept")
    once = OncePerInterval(ACCEPT_ERROR, 10.0, clock=lambda: now)
    logger.addFilter(once)
    try:
        with caplog.at_level(logging.ERROR, logger.name):
            for _ in range(1000):
                logger.error("%s\nexception: [Errno 24] Too many open files", ACCEPT_ERROR)
            logger.error("another error")
            now = 10.0
            logger.error("%s\nexception: [Errno 24] Too many open files", ACCEPT_ERROR)
    finally:
        logger.removeFilter(once)
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 3
    assert messages[1] == "another error"
    assert messages[2].endswith("(999 more held back since the last one logged)")


def test_a_server_with_an_http_port_throttles_asyncios_accept_errors(door: RunningServer,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, "asyncio"):
        for _ in range(100):
            logging.getLogger("asyncio").error("%s\nexception: [Errno 24] Too many open files", ACCEPT_ERROR)
    assert len(caplog.records) <= 1


def test_request_heads_that_do_not_parse_are_logged_at_most_once_per_interval_without_quoting_them(
        door: RunningServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, "aiohttp.server"):
        for _ in range(3):
            with connect(door) as sock:
                sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: test\r\nX-Bad: " + b"\x01" * 5000 + b"\r\n\r\n")
                assert status_of(sock) == 400
    records = [record for record in caplog.records if record.name == "aiohttp.server"]
    assert len(records) <= 1
    assert all(record.exc_info is None and len(record.getMessage()) < MOST_LOG_CHARS for record in records)


# -- TLS handshakes --------------------------------------------------------------------------------------------------

TLS_HEADER_TIMEOUT_S = 4.0
# A refused connection closes as it is accepted; an admitted one that says nothing waits for the handshake timeout.
AT_ONCE_S = 0.5


@pytest.fixture(scope="module")
def tls_certificates() -> Certificates:
    return issue_certificates()


@pytest.fixture(scope="module")
def tls_capped(tiny_models: dict[str, LoadedModel], tls_certificates: Certificates,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A TLS server with small connection caps (2 from one address, 3 in all) and a short handshake timeout."""
    paths = write_certificates(tmp_path_factory.mktemp("tls"), tls_certificates)
    server = start_server(tiny_models["custom_voice"], http_port=free_port(), api_keys=frozenset({API_KEY}),
                          tls_cert=paths["tls_cert"], tls_key=paths["tls_key"], max_http_connections=3,
                          max_http_connections_per_address=2, http_header_timeout_seconds=TLS_HEADER_TIMEOUT_S)
    yield server
    server.stop()


def tls_status(server: RunningServer, certificates: Certificates, directory: Path, source: str) -> int:
    """GET /v1/models over TLS from `source`, trusting the test CA: its status."""
    (directory / "ca.pem").write_bytes(certificates.ca.certificate)
    context = ssl.create_default_context(cafile=directory / "ca.pem")
    connection = http.client.HTTPSConnection("127.0.0.1", http_port(server), timeout=10, context=context,
                                             source_address=(source, 0))
    try:
        return models_status(connection)
    finally:
        connection.close()


def test_over_tls_connections_still_in_their_handshake_count_toward_the_caps(
        tls_capped: RunningServer, tls_certificates: Certificates, tmp_path: Path) -> None:
    """Counted only once their handshake was done, connections that never finished one escaped the caps: each held a
    descriptor for the handshake timeout however many a client opened."""
    silent = [connect(tls_capped, "127.0.0.1") for _ in range(2)]
    try:
        time.sleep(0.2)  # both accepted
        with connect(tls_capped, "127.0.0.1") as beyond:
            assert seconds_until_closed(beyond) < AT_ONCE_S
        assert tls_status(tls_capped, tls_certificates, tmp_path, "127.0.0.2") == 200
        with connect(tls_capped, "127.0.0.3") as third:  # two silent and one served: the cap in all is full
            time.sleep(0.2)
            with connect(tls_capped, "127.0.0.4") as beyond_all:
                assert seconds_until_closed(beyond_all) < AT_ONCE_S
            third.close()
    finally:
        for sock in silent:
            sock.close()
    time.sleep(0.3)  # the server has seen them go
    assert tls_status(tls_capped, tls_certificates, tmp_path, "127.0.0.1") == 200


def test_over_tls_a_handshake_never_finished_is_closed_at_the_header_timeout(tls_capped: RunningServer) -> None:
    with connect(tls_capped, "127.0.0.5") as sock:
        sock.sendall(b"\x16\x03\x01\x02\x00")  # a TLS record's header, announcing a hello that never comes
        open_s = seconds_until_closed(sock)
    assert TLS_HEADER_TIMEOUT_S * 0.9 <= open_s < TLS_HEADER_TIMEOUT_S + CLOSE_MARGIN_S
