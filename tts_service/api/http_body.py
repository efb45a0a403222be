"""The HTTP API's request body: read within a size and a time limit, and parsed as strict JSON.

A speech request is a small, flat JSON object (reference audio never travels over HTTP), so a body is read only up
to the application's `client_max_size` (--max-http-body-bytes): a Content-Length beyond it is refused before a byte
of the body is read, and a chunked body is cut where it passes it. A body larger than the gRPC door parses on the
event loop (`MAX_BYTES_PARSED_ON_LOOP`) is parsed in a worker thread, so that other calls and health checks keep
being answered meanwhile. Strict means: UTF-8, no NaN or Infinity, no string (a key included) holding a lone
surrogate, which no encoder downstream can take, and no container nested deeper than MAX_DEPTH.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, NoReturn

from aiohttp import hdrs, web

from tts_service.api.interceptors import MAX_BYTES_PARSED_ON_LOOP

MAX_DEPTH = 8  # a speech request nests one object (`voice`) in another
JSON_TYPE = "application/json"
_CHARSETS = ("utf-8", "utf8")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class BodyRefused(Exception):
    """An HTTP status for a body the API does not take; `message` says why (naming a limit, never echoing the body),
    `param` is the parameter it is about (None: the request's headers)."""

    def __init__(self, status: int, message: str, param: str | None = "body") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


async def read_json(request: web.Request, timeout_s: float) -> Any:
    """The body of `request`, parsed; raises BodyRefused for one that is not UTF-8 JSON (415, 400), larger than the
    application accepts (413), or not all there within `timeout_s` of the head (408)."""
    _check_media_type(request)
    max_bytes = request.client_max_size
    if request.content_length is not None and request.content_length > max_bytes:
        raise _too_large(max_bytes)
    try:
        async with asyncio.timeout(timeout_s):
            data = await request.read()
    except TimeoutError:
        raise BodyRefused(408, f"body: did not arrive within {timeout_s:g} s (--http-body-timeout-seconds)") from None
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(max_bytes) from None
    if len(data) <= MAX_BYTES_PARSED_ON_LOOP:
        return parse_json(data)
    return await asyncio.to_thread(parse_json, data)


def parse_json(data: bytes) -> Any:
    """`data` as strict JSON (see the module's docstring); raises BodyRefused (400)."""
    try:
        value = json.loads(data.decode("utf-8"), parse_constant=_not_a_number)
    except UnicodeDecodeError:
        raise BodyRefused(400, "body: is not valid UTF-8") from None
    except RecursionError:  # json's scanner bounds its own recursion, far deeper than MAX_DEPTH
        raise _too_deep() from None
    except ValueError:  # not JSON, or a number of more digits than Python converts
        raise BodyRefused(400, "body: is not valid JSON") from None
    _check_depth_and_strings(value)
    return value


def _check_media_type(request: web.Request) -> None:
    if request.content_type != JSON_TYPE or (request.charset or "utf-8").lower() not in _CHARSETS:
        raise BodyRefused(415, f"the body must be JSON in UTF-8, sent with 'Content-Type: {JSON_TYPE}'", param=None)
    # Decompressing would run on the event loop, to a size unknown until it is done.
    if request.headers.get(hdrs.CONTENT_ENCODING, "identity").lower() != "identity":
        raise BodyRefused(415, "the body must not be compressed (Content-Encoding)", param=None)


def _check_depth_and_strings(value: Any) -> None:
    """Walked with a stack of its own, not recursion: every container within MAX_DEPTH, every string whole."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                raise BodyRefused(400, "body: a string holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is "
                                       "not a character")
        elif isinstance(item, dict | list):
            if depth == MAX_DEPTH:
                raise _too_deep()
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)


def _not_a_number(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _too_large(max_bytes: int) -> BodyRefused:
    return BodyRefused(413, f"body: is larger than the {max_bytes} bytes accepted (--max-http-body-bytes)")


def _too_deep() -> BodyRefused:
    return BodyRefused(400, f"body: is nested deeper than the {MAX_DEPTH} levels accepted")
