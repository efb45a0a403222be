"""The HTTP ports' guard on connections, applied as each is accepted, before any request on it is read and so before
any API key is checked.

aiohttp keeps a connection for as long as its client does: a request head sent a byte at a time is waited for
however long it takes, and one client may open connections until the process has no file descriptor left. A hostile
test held 19,904 descriptors with half-sent heads; every accept then failed, and asyncio logged each failure (52,351
lines in 31 s). `ConnectionGuard` stands between a listening socket and aiohttp's server as its protocol factory:
- a connection beyond the cap on open connections, or on one client address's, is closed as it is accepted;
- a request head must arrive whole within the header timeout of its first byte (the rest of a body left unread by
  its answered request counts as the next head's bytes);
- the wait for a request, from the connection's opening or its last response, is bounded by aiohttp's own
  keep-alive timeout, and a body's pace is the handler's to bound (`openai_http` reads a body under a deadline).
On a TLS port the guard takes each connection before its handshake and counts it from there, so that connections
that never finish a handshake are held to the caps too; a handshake not done within the header timeout is cut.
`bound_http_logs` keeps what hostile clients make the server log short and rare: asyncio's line for a failing accept,
and aiohttp's for a request head that does not parse (whose traceback quotes the head), once per interval each; and
the 400 that answers such a head quotes none of it (`QuotelessRequestHandler`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

ACCEPT_ERROR = "socket.accept() out of system resource"
BAD_HEAD = "refused a request head that does not parse"
LOG_INTERVAL_S = 10.0
# An IPv6 host is given a whole /64, and could open each connection from another address in it.
_IPV6_HOST_PREFIX = 64


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    max_connections_per_address: int
    header_timeout_s: float


def client_address(peername: tuple[Any, ...]) -> str:
    """The address a TCP connection counts under: its peer's IPv4 address (an IPv4-mapped IPv6 one too), or the /64
    of its peer's IPv6 address."""
    address = ipaddress.ip_address(peername[0])
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, _IPV6_HOST_PREFIX), strict=False))
    return str(address)


class QuotelessRequestHandler(web.RequestHandler):
    """aiohttp's protocol for one connection, except that its 400 for a request head that does not parse says only
    that: aiohttp's own quotes the offending line (up to 8 KiB, escaped) back to whoever sent it."""

    __slots__ = ()

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if isinstance(exc, HttpProcessingError):
            message = f"{status} {HTTPStatus(status).phrase}: the request head does not parse as HTTP/1.1"
        return super().handle_error(request, status, exc, message)


class ConnectionGuard:
    """The protocol factory of one HTTP port (for `loop.create_server`, with no TLS of its own): it counts each
    accepted connection, in all and by client address, and has aiohttp's `server` serve those that `limits` admit,
    over `tls` when given, from the end of their handshake. `handler_options` are the runner's options for aiohttp's
    protocol (`web.AppRunner`'s keyword arguments that `web.Server` hands on to it)."""

    def __init__(self, server: web.Server, limits: ConnectionLimits, handler_options: dict[str, Any],
                 tls: ssl.SSLContext | None = None) -> None:
        self.limits = limits
        self.tls = tls
        self._server = server
        self._handler_options = handler_options
        self._connections: dict[web.RequestHandler, GuardedConnection] = {}
        self._num_by_address: Counter[str] = Counter()
        # A request reaching its handler is the end of its head; the handler's return starts the wait for the next.
        handle = server.request_handler

        async def handle_watched(request: web.BaseRequest) -> web.StreamResponse:
            connection = self._connections.get(request.protocol)
            if connection is not None:  # None: the connection closed before its request's turn came
                connection.request_started()
            try:
                return await handle(request)
            finally:
                if connection is not None:
                    connection.request_ended()

        server.request_handler = handle_watched

    def __call__(self) -> GuardedConnection:
        return GuardedConnection(self)

    def admit(self, connection: GuardedConnection, address: str) -> web.RequestHandler | None:
        """aiohttp's protocol for a connection from `address`, counted; None beyond a cap."""
        if (len(self._connections) >= self.limits.max_connections
                or self._num_by_address[address] >= self.limits.max_connections_per_address):
            return None
        handler = QuotelessRequestHandler(self._server, loop=asyncio.get_running_loop(), **self._handler_options)
        self._connections[handler] = connection
        self._num_by_address[address] += 1
        return handler

    def release(self, handler: web.RequestHandler, address: str) -> None:
        del self._connections[handler]
        self._num_by_address[address] -= 1
        if not self._num_by_address[address]:
            del self._num_by_address[address]


class GuardedConnection(asyncio.Protocol):
    """One accepted connection: served by aiohttp's protocol if the caps admit it (after its TLS handshake, on a TLS
    port), closed at once if not, and closed when its handshake or a request head takes longer than the header
    timeout."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard
        self._handler: web.RequestHandler | None = None  # aiohttp's protocol, once admitted
        self._transport: asyncio.Transport | None = None
        self._address = ""
        self._head_deadline: asyncio.TimerHandle | None = None
        self._is_in_request = False
        self._handshake: asyncio.Task[None] | None = None  # held here: the loop keeps tasks only weakly
        self._is_served = False  # aiohttp's protocol has the connection (over TLS, once the handshake is done)
        self._is_counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._address = client_address(transport.get_extra_info("peername"))
        self._handler = self._guard.admit(self, self._address)
        if self._handler is None:
            # Nothing was read and nothing is owed: the descriptor goes back at once, and nothing is logged, so
            # that a flood of connections costs neither descriptors nor log lines.
            transport.abort()
            return
        self._is_counted = True
        self._transport = transport
        if self._guard.tls is None:
            self._serve(transport)
        else:
            # Nothing may be read before the handshake takes the connection (the client's hello is its).
            transport.pause_reading()
            self._handshake = asyncio.ensure_future(self._start_tls(transport, self._guard.tls))

    async def _start_tls(self, transport: asyncio.Transport, tls: ssl.SSLContext) -> None:
        if transport.is_closing():  # gone before its handshake could start: connection_lost has released it
            return
        try:
            secure = await asyncio.get_running_loop().start_tls(
                transport, self, tls, server_side=True, ssl_handshake_timeout=self._guard.limits.header_timeout_s)
        except asyncio.CancelledError:
            self._release()
            raise
        except (OSError, TimeoutError):  # ssl.SSLError is an OSError; start_tls has closed the connection
            self._release()
            return
        if secure is None:  # the connection went as its handshake ended
            self._release()
            return
        self._transport = secure
        self._serve(secure)

    def _serve(self, transport: asyncio.Transport) -> None:
        assert self._handler is not None
        self._is_served = True
        self._handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        assert self._handler is not None  # a refused connection was aborted before it could read
        if not self._is_in_request and self._head_deadline is None:
            self._head_deadline = asyncio.get_running_loop().call_later(self._guard.limits.header_timeout_s,
                                                                        self._head_too_slow)
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        assert self._handler is not None
        return self._handler.eof_received()

    def pause_writing(self) -> None:
        assert self._handler is not None
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        assert self._handler is not None
        self._handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        self._release()
        if self._handler is not None and self._is_served:
            self._handler.connection_lost(exc)

    def _release(self) -> None:
        if self._is_counted:
            assert self._handler is not None
            self._is_counted = False
            self._guard.release(self._handler, self._address)

    def request_started(self) -> None:
        self._is_in_request = True
        self._cancel_head_deadline()

    def request_ended(self) -> None:
        self._is_in_request = False

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        assert self._transport is not None  # armed only once admitted
        self._transport.abort()

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None


class OncePerInterval(logging.Filter):
    """Lets a record whose message starts with `prefix` through at most once per `interval_s`; the next one let
    through says how many were held back since the last."""

    def __init__(self, prefix: str, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._prefix = prefix
        self._interval_s = interval_s
        self._clock = clock
        self._next_at = -math.inf
        self._num_held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith(self._prefix):
            return True
        now = self._clock()
        if now < self._next_at:
            self._num_held += 1
            return False
        self._next_at = now + self._interval_s
        if self._num_held:
            record.msg = f"{record.getMessage()}\n({self._num_held} more held back since the last one logged)"
            record.args = None
            self._num_held = 0
        return True


class WithoutQuotedHead(logging.Filter):
    """aiohttp logs each request head it cannot parse at ERROR with a traceback, whose message quotes the head's
    offending line (up to 8 KiB, escaped to about three times that). Such a head is its client's fault: its record
    keeps the status and the client's address, without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info is not None else None
        if isinstance(error, HttpProcessingError):
            record.msg = f"{BAD_HEAD} (HTTP {error.code}) from %s"
            record.exc_info = None
            record.exc_text = None
        return True


# One set of filters for the process, as the loggers are. asyncio retries a failing accept up to the listen backlog's
# length at once and logs every failure with its traceback; aiohttp logs every head that does not parse.
_LOG_FILTERS = {"asyncio": (OncePerInterval(ACCEPT_ERROR, LOG_INTERVAL_S),),
                "aiohttp.server": (WithoutQuotedHead(), OncePerInterval(BAD_HEAD, LOG_INTERVAL_S))}


def bound_http_logs() -> None:
    """At most one line per interval for a failing accept (out of file descriptors or memory) and for a request head
    that does not parse, neither quoting what a client sent."""
    for name, filters in _LOG_FILTERS.items():
        for log_filter in filters:
            logging.getLogger(name).addFilter(log_filter)
