"""Server interceptors: API keys (all calls but health checks); admission (UNAVAILABLE while loading or draining)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc

from qwen3_tts.v1.protocol import SERVICE_NAME

_HEALTH_SERVICE_PREFIX = "/grpc.health.v1.Health/"
_TTS_METHOD_PREFIX = f"/{SERVICE_NAME}/"



def refusing_handler(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that ends every call at once with `code`."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    if handler.unary_unary:
        build = grpc.unary_unary_rpc_method_handler
    elif handler.unary_stream:
        build = grpc.unary_stream_rpc_method_handler
    elif handler.stream_unary:
        build = grpc.stream_unary_rpc_method_handler
    else:
        build = grpc.stream_stream_rpc_method_handler
    return build(refuse, request_deserializer=handler.request_deserializer,
                 response_serializer=handler.response_serializer)


Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Every call but health checks needs a configured key, as `authorization: Bearer KEY` or `x-api-key: KEY`."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = [key.encode() for key in keys]

    async def intercept_service(self, continuation: Continuation,
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or details.method.startswith(_HEALTH_SERVICE_PREFIX):
            return handler
        if self._is_authorized(details.invocation_metadata or ()):
            return handler
        return refusing_handler(handler, grpc.StatusCode.UNAUTHENTICATED,
                                "a valid API key is required: send 'authorization: Bearer KEY' or 'x-api-key: KEY'")

    def _is_authorized(self, metadata: Iterable[tuple[str, str | bytes]]) -> bool:
        for name, value in metadata:
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            if name == "authorization" and text[:7].lower() == "bearer ":
                text = text[7:].strip()
            elif name != "x-api-key":
                continue
            # Compare with every key, in constant time, so timing reveals nothing about them.
            if any([hmac.compare_digest(text.encode(), key) for key in self._keys]):
                return True
        return False


class ServingState:
    def __init__(self) -> None:
        self.is_ready = False
        self.is_draining = False


class AdmissionInterceptor(grpc.aio.ServerInterceptor):
    """Speech calls get UNAVAILABLE while the model loads and while the server drains."""

    def __init__(self, state: ServingState) -> None:
        self._state = state

    async def intercept_service(self, continuation: Continuation,
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(_TTS_METHOD_PREFIX):
            return handler
        if self._state.is_draining:
            return refusing_handler(handler, grpc.StatusCode.UNAVAILABLE, "the server is shutting down; retry")
        if not self._state.is_ready:
            return refusing_handler(handler, grpc.StatusCode.UNAVAILABLE, "the server is still loading; retry")
        return handler
