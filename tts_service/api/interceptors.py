"""Server interceptors: API keys (all calls but health checks); admission (UNAVAILABLE while loading or draining);
request parsing (INVALID_ARGUMENT for a message whose bytes do not parse)."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import functools
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.message import DecodeError

from qwen3_tts.v1.protocol import SERVICE_NAME
from tts_service.api.callers import Credentials
from tts_service.api.errors import ApiError, abort_with, invalid

_HEALTH_SERVICE_PREFIX = "/grpc.health.v1.Health/"
MAX_BYTES_PARSED_ON_LOOP = 64 * 1024
_TTS_METHOD_PREFIX = f"/{SERVICE_NAME}/"



def _same_kind(handler: grpc.RpcMethodHandler, behavior: Callable[..., Any],
               request_deserializer: Callable[[bytes], Any] | None) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` (unary or streaming, each way) that runs `behavior`."""
    if handler.unary_unary:
        build = grpc.unary_unary_rpc_method_handler
    elif handler.unary_stream:
        build = grpc.unary_stream_rpc_method_handler
    elif handler.stream_unary:
        build = grpc.stream_unary_rpc_method_handler
    else:
        build = grpc.stream_stream_rpc_method_handler
    return build(behavior, request_deserializer=request_deserializer, response_serializer=handler.response_serializer)


def refusing_handler(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that ends every call at once with `code`."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    return _same_kind(handler, refuse, handler.request_deserializer)


@functools.cache
def _request_type(method: str) -> str:
    """The full name of the request message of `method` ("/package.Service/Method")."""
    try:
        return descriptor_pool.Default().FindMethodByName(method.lstrip("/").replace("/", ".")).input_type.full_name
    except KeyError:  # a service whose descriptors are not in the default pool: its method names the request
        return f"{method} request"


@dataclasses.dataclass(frozen=True)
class Ending:
    """How a call ends, kept without the exception that said so (and the frames its traceback holds)."""

    error: ApiError | None  # None: the call was already aborted, its status set
    # grpc's own exception from that abort, raised again as it is: grpc checks that a handler ends with the very
    # exception its abort() raised, and logs any other as an error of the server (a refusal under load did).
    aborted: grpc.aio.AbortError | None = None

    @classmethod
    def of(cls, error: ApiError | grpc.aio.AbortError) -> Ending:
        # The context managers the error passed through keep it in their frames, which its traceback holds:
        # a cycle that would keep the request alive until a full garbage collection.
        error.__traceback__ = None
        if isinstance(error, ApiError):
            return cls(ApiError(error.code, error.message, error.retry_after_s))
        return cls(None, error)

    async def end(self, context: grpc.aio.ServicerContext) -> None:
        if self.error is not None:
            await abort_with(context, self.error)
        assert self.aborted is not None
        raise self.aborted


def parsing_handler(handler: grpc.RpcMethodHandler, request_type: str) -> grpc.RpcMethodHandler:
    """`handler` taking its request's bytes and parsing them itself, so that bytes that are not a
    `request_type` end the call with INVALID_ARGUMENT. Its behaviour is a coroutine or an async generator
    function, as grpc.aio's are."""
    parse = handler.request_deserializer
    behavior = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream

    def parse_checked(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError:
            raise invalid("request", f"the bytes are not a valid {request_type} message") from None

    async def parsed(data: bytes) -> Any:
        # A large message (reference audio, or an oversized field) is parsed in a worker thread: tens of
        # megabytes parsed on the event loop would stall every other call, health checks included.
        if len(data) <= MAX_BYTES_PARSED_ON_LOOP:
            return parse_checked(data)
        return await asyncio.to_thread(parse_checked, data)

    async def parsed_stream(messages: AsyncIterator[bytes]) -> AsyncIterator[Any]:
        async for data in messages:
            yield await parsed(data)
    # A streamed message that does not parse raises where the handler reads it: the servicer's handlers
    # answer that ApiError themselves; another service's handler lets it through, to be answered here.
    #
    # An exception that ends a call is not let out of here as it is: its traceback holds the handler's frames,
    # and in them the request (up to tens of megabytes), and grpc keeps it in a reference cycle until a garbage
    # collection. So the call ends with a fresh exception, raised outside the handler's frames.
    if inspect.isasyncgenfunction(behavior):
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            ending: Ending | None = None
            try:
                requests = parsed_stream(request) if handler.request_streaming else await parsed(request)
                async with contextlib.aclosing(behavior(requests, context)) as responses:
                    async for response in responses:
                        yield response
            except (ApiError, grpc.aio.AbortError) as error:
                ending = Ending.of(error)
            if ending is not None:
                request = requests = None  # this frame is in the ending's traceback: let the request go
                await ending.end(context)

        return _same_kind(handler, stream, None)

    async def answer(request: Any, context: grpc.aio.ServicerContext) -> Any:
        ending: Ending | None = None
        try:
            requests = parsed_stream(request) if handler.request_streaming else await parsed(request)
            return await behavior(requests, context)
        except (ApiError, grpc.aio.AbortError) as error:
            ending = Ending.of(error)
        request = requests = None  # this frame is in the ending's traceback: let the request go
        await ending.end(context)

    return _same_kind(handler, answer, None)


Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


# Told of every call an interceptor refuses: its method's name and the status it got.
RefusalObserver = Callable[[str, grpc.StatusCode], None]


def method_name(method: str) -> str:
    """"/package.Service/Method" -> "Method", the `rpc` label of a call."""
    return method.rpartition("/")[2]


class RefusingInterceptor(grpc.aio.ServerInterceptor):
    """Refuses the calls it covers that `refusal` finds a reason to refuse, before they run; each refusal is
    counted through `on_refused`."""

    def __init__(self, on_refused: RefusalObserver) -> None:
        self._on_refused = on_refused

    @abc.abstractmethod
    def covers(self, method: str) -> bool:
        """Whether calls of `method` ("/package.Service/Method") are this interceptor's to refuse."""

    @abc.abstractmethod
    def refusal(self, details: grpc.HandlerCallDetails) -> ApiError | None:
        """Why the call may not run; None: it may."""

    async def intercept_service(self, continuation: Continuation,
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or not self.covers(details.method):
            return handler
        error = self.refusal(details)
        if error is None:
            return handler
        self._on_refused(method_name(details.method), error.code)
        return refusing_handler(handler, error.code, error.message)


class ApiKeyInterceptor(RefusingInterceptor):
    """Every call but health checks presents exactly one credential, a configured key (callers.Credentials)."""

    def __init__(self, credentials: Credentials, on_refused: RefusalObserver) -> None:
        super().__init__(on_refused)
        self._credentials = credentials

    def covers(self, method: str) -> bool:
        return not method.startswith(_HEALTH_SERVICE_PREFIX)

    def refusal(self, details: grpc.HandlerCallDetails) -> ApiError | None:
        try:
            self._credentials.authenticate(details.invocation_metadata or ())
        except ApiError as error:
            return error
        return None


class ServingState:
    """Whether the server serves speech: not before its engine runs, nor once it drains."""

    def __init__(self) -> None:
        self.is_ready = False
        self._draining = asyncio.Event()

    @property
    def is_draining(self) -> bool:
        return self._draining.is_set()

    def start_draining(self) -> None:
        self._draining.set()

    async def wait_draining(self) -> None:
        await self._draining.wait()


class AdmissionInterceptor(RefusingInterceptor):
    """Speech calls get UNAVAILABLE while the model loads and while the server drains."""

    def __init__(self, state: ServingState, on_refused: RefusalObserver) -> None:
        super().__init__(on_refused)
        self._state = state

    def covers(self, method: str) -> bool:
        return method.startswith(_TTS_METHOD_PREFIX)

    def refusal(self, details: grpc.HandlerCallDetails) -> ApiError | None:
        if self._state.is_draining:
            return ApiError(grpc.StatusCode.UNAVAILABLE, "the server is shutting down; retry")
        if not self._state.is_ready:
            return ApiError(grpc.StatusCode.UNAVAILABLE, "the server is still loading; retry")
        return None


class RequestParsingInterceptor(grpc.aio.ServerInterceptor):
    """A request message whose bytes do not parse ends its call with INVALID_ARGUMENT naming the message type.

    grpc.aio parses a unary request before the handler runs and answers a failure UNKNOWN, with the
    parser's exception class in the status message; a streamed message's failure reaches the handler as
    an unexpected error. So handlers get the bytes and parse them themselves (`parsing_handler`). Put it
    last among the interceptors: those before it then refuse calls without parsing them.
    """

    def __init__(self) -> None:
        # A method's handler is the same object call after call, so its wrapper is made once, not a call: made a
        # call, its closures were objects that every call in flight held, and a full garbage collection's pause grows
        # with those. A handler another interceptor made for one call (a refusal) is wrapped for that call alone.
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(self, continuation: Continuation,
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        known = self._wrapped.get(details.method)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = parsing_handler(handler, _request_type(details.method))
        self._wrapped[details.method] = (handler, wrapped)
        return wrapped
