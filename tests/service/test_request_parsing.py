"""The interceptor that parses request bytes itself: a method's wrapper is made once, not for every call."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import grpc

from tts_service.api.interceptors import RequestParsingInterceptor

METHOD = "/qwen3_tts.v1.TextToSpeech/SynthesizeOnline"


async def echo(request: Any, context: Any) -> Any:
    return request


def handler() -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(echo, request_deserializer=bytes.decode,
                                               response_serializer=str.encode)


def test_a_methods_handler_is_wrapped_once_and_one_made_for_a_single_call_is_wrapped_alone() -> None:
    interceptor = RequestParsingInterceptor()
    served, refusing = handler(), handler()

    def intercept(current: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        async def continuation(details: Any) -> grpc.RpcMethodHandler:
            return current
        details = SimpleNamespace(method=METHOD, invocation_metadata=())
        wrapped = asyncio.run(interceptor.intercept_service(continuation, details))
        assert wrapped is not None and wrapped is not current and wrapped.request_deserializer is None
        return wrapped

    first = intercept(served)
    assert intercept(served) is first
    alone = intercept(refusing)
    assert alone is not first and intercept(served) is not alone
    assert asyncio.run(intercept(served).unary_unary(b"hello", None)) == "hello"
