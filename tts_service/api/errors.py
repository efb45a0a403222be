"""Errors as gRPC statuses: which status each engine or input error becomes, and how a call ends with it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from tts_service.audio.output import AudioFormatError
from tts_service.audio.reference import ReferenceAudioError
from tts_service.engine import (
    EngineCoreLost,
    EngineStoppedError,
    PromptError,
    QueueFullError,
    RequestFailed,
    RequestTooLargeError,
    VoiceStoreFullError,
)

logger = logging.getLogger("tts_service.api.server")

# How long a client refused for a full queue should wait: about one short utterance's generation.
QUEUE_FULL_RETRY_DELAY_S = 1.0
# The engine names voice fields bare; the API nests them in `voice`.
_PROMPT_FIELDS = {"speaker": "voice.speaker", "language": "voice.language", "instruction": "voice.instruction"}



class ApiError(Exception):
    """A status to end a call with; `field` names the request field an INVALID_ARGUMENT is about, if one is."""

    def __init__(self, code: grpc.StatusCode, message: str, retry_after_s: float | None = None,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s
        self.field = field


def invalid(field: str, message: str) -> ApiError:
    return ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {message}", field=field)


def api_error_for(error: Exception) -> ApiError | None:
    """The status an engine or input error becomes; None for an unexpected error."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, PromptError):
        field = _PROMPT_FIELDS.get(error.field, error.field)
        return invalid(field, str(error).removeprefix(f"{error.field}: "))
    if isinstance(error, AudioFormatError):
        return ApiError(grpc.StatusCode.INVALID_ARGUMENT, str(error), field=error.field)
    if isinstance(error, ReferenceAudioError):
        return invalid("voice.reference_audio", str(error))
    if isinstance(error, QueueFullError):
        return ApiError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the server is busy ({error}); retry later",
                        retry_after_s=QUEUE_FULL_RETRY_DELAY_S)
    if isinstance(error, RequestTooLargeError):
        return ApiError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                        "the request needs more memory than the server has; ask for less audio "
                        "(generation.max_audio_seconds) or send a shorter text or reference")
    if isinstance(error, VoiceStoreFullError):
        return ApiError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
    if isinstance(error, EngineStoppedError):
        return ApiError(grpc.StatusCode.UNAVAILABLE, "the server is shutting down; retry")
    if isinstance(error, EngineCoreLost):  # before RequestFailed, which it is: the request itself did not fail
        return ApiError(grpc.StatusCode.UNAVAILABLE, "the server lost its engine during the request; retry")
    if isinstance(error, RequestFailed):
        return ApiError(grpc.StatusCode.INTERNAL, "the request failed inside the server")
    return None


async def abort_with(context: grpc.aio.ServicerContext, error: ApiError) -> None:
    """End the call with `error`; a retry delay travels as google.rpc.RetryInfo in the status details."""
    if error.retry_after_s is None:
        await context.abort(error.code, error.message)
        return
    delay = duration_pb2.Duration()
    delay.FromNanoseconds(int(error.retry_after_s * 1e9))
    detail = status_pb2.Status(code=getattr(code_pb2, error.code.name), message=error.message)
    detail.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    status = rpc_status.to_status(detail)
    await context.abort(status.code, status.details, status.trailing_metadata)


INTERNAL_ERROR = ApiError(grpc.StatusCode.INTERNAL, "the request failed inside the server")


def logged_api_error(error: Exception) -> ApiError:
    """The status `error` ends its call with, logged as every door logs a call's failure: an unexpected error with
    its traceback (and answered INTERNAL with no internals), a known INTERNAL one as an error, the rest as news."""
    api_error = api_error_for(error)
    if api_error is None:
        logger.exception("failed")
        return INTERNAL_ERROR
    if api_error.code is grpc.StatusCode.INTERNAL:
        logger.error("failed: %s", error)
    else:
        logger.info("answered %s: %s", api_error.code.name, api_error.message)
    return api_error


def ending_status_name(error: BaseException, was_expired: bool, client_gone: tuple[type[BaseException], ...]) -> str:
    """The status name a call that `error` ended has: CANCELLED when its client went away (`client_gone`), or
    DEADLINE_EXCEEDED when the server's limit on its life ended it; else the status the error maps to."""
    if isinstance(error, client_gone):
        return "DEADLINE_EXCEEDED" if was_expired else "CANCELLED"
    api_error = api_error_for(error) if isinstance(error, Exception) else None
    return "INTERNAL" if api_error is None else api_error.code.name


@contextlib.asynccontextmanager
async def answering_errors(context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
    """Ends the call with the status a known error maps to; anything else is INTERNAL, and logged.

    A call that ended under the handler (the client left, or its deadline passed) makes gRPC's next
    write to it fail with grpc.aio.InternalError: there is nobody left to answer, so the handler
    ends as a cancelled one does, quietly, instead of as a failure of the server.
    """
    try:
        try:
            yield
            return
        except (grpc.aio.AbortError, grpc.aio.InternalError):
            raise
        except Exception as error:  # every failure of one call ends that call only
            api_error = logged_api_error(error)
            # The caught error's traceback holds the handler's frames, and the request in them (up to megabytes):
            # dropped, and the call ended with a fresh error outside this block, so that no reference cycle keeps
            # them until a full garbage collection.
            error.__traceback__ = None
            api_error = ApiError(api_error.code, api_error.message, api_error.retry_after_s)
        await abort_with(context, api_error)
    except grpc.aio.InternalError as error:
        logger.info("the call ended before it could be answered: %s", error)
        raise asyncio.CancelledError from error
