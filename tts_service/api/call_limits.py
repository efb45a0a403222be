"""The limits on a streamed call's life, read where its messages are read (gRPC's StreamingSynthesize and the
WebSocket door alike): the idle limit between the client's messages and the limit on the call's whole life."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from tts_service.api.config import ServerConfig
from tts_service.api.errors import ApiError


def idle_error(config: ServerConfig) -> ApiError:
    return ApiError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no text arrived for "
                    f"{config.stream_idle_timeout_seconds:g} s; send text more often or close the stream")


def call_too_long_error(config: ServerConfig) -> ApiError:
    return ApiError(grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the call ran past the server's limit of {config.max_stream_seconds:g} s (--max-stream-seconds)")


async def next_message(messages: AsyncIterator[Any], config: ServerConfig, started: float) -> Any | None:
    """The client's next message, or None when it has ended its messages; the idle limit and the limit on the
    call's life (counted from `started`, time.monotonic()) end the call with DEADLINE_EXCEEDED."""
    remaining_s = config.max_stream_seconds - (time.monotonic() - started)
    if remaining_s <= 0:
        raise call_too_long_error(config)
    timeout = min(config.stream_idle_timeout_seconds, remaining_s)
    try:
        # A timeout scope, not wait_for, which would wrap every message's read in a task of its own.
        async with asyncio.timeout(timeout):
            return await anext(messages)
    except StopAsyncIteration:
        return None
    except TimeoutError:
        raise (idle_error(config) if timeout < remaining_s else call_too_long_error(config)) from None
