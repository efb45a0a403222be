"""The OpenAI-compatible HTTP API, beside the gRPC one and on the same engine: POST /v1/audio/speech, GET /v1/models.

A speech call goes through the steps the gRPC servicer takes too (`speech.SpeechSteps`: `speech_call`,
`prepare`, `submit`, `encoded_audio`, `whole_audio`): the same API keys, per-caller limit, input limits, metrics
(rpc label `OpenAISpeech`), spans and logs as a gRPC call; this door knows nothing of the servicer itself. Only
the translation is here: the JSON body into a qwen3_tts.v1 VoiceSelection, errors into OpenAI's error JSON, audio
into a chunked body or server-sent events. `voice` names a built-in speaker of a CustomVoice model, or on a Base
model a voice registered over gRPC (CreateVoice); for a VoiceDesign model `instructions` describes the voice.
`model` is the served model's id or one of OpenAI's speech model names, so that a client written for OpenAI runs
unchanged.

WAV, PCM, Opus and MP3 (frames, without the LAME tag a whole file would carry, as OpenAI streams it) are sent as
the engine produces them. FLAC is encoded as the audio comes, into a temporary file (in memory while it is small,
on disk past that), and sent once the audio is complete: libsndfile finishes it by rewriting its start. A client
that disconnects cancels its handler (aiohttp's handler cancellation), which aborts its request in the engine.

Nothing a client sends is trusted further than the gRPC door trusts it: the body is read within a size and a time
limit and parsed as strict JSON (`http_body`), every parameter is checked against the same table of limits
(InputLimits) before it is used, and no answer or log line quotes more of a value than `_MOST_CHARS_QUOTED`.
The connections themselves are bounded before any request is read (`http_connections`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import grpc
from aiohttp import web

from observability.calls import CallRecord
from qwen3_tts.v1.protocol import tts_pb2
from tts_service.api.config import InputLimits, ServerConfig
from tts_service.api.errors import ApiError, ending_status_name, invalid, logged_api_error
from tts_service.api.http_body import BodyRefused, read_json
from tts_service.api.interceptors import ServingState
from tts_service.api.messages import check_length
from tts_service.api.speech import SpeechSteps
from tts_service.audio.output import MODEL_SAMPLE_RATE, AudioEncoding, FileEncoder, FileEncoding, OutputFormat
from tts_service.engine import FinishReason, ModelInfo, RequestStream, SynthesisSummary

logger = logging.getLogger("tts_service.api.server")

pb: Any = tts_pb2
SPEECH_RPC = "OpenAISpeech"
MODELS_RPC = "OpenAIModels"
SPEECH_ROUTE = "POST /v1/audio/speech"
# OpenAI's speech model names, accepted for the served model.
MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
# MP3 streams as frames (OpenAI's default format: the SDK's first bytes come with the first audio), as OpenAI's own
# stream does, so without the LAME tag a whole file would carry.
_STREAMED_FORMATS = {"wav": AudioEncoding.WAV, "pcm": AudioEncoding.PCM16, "opus": AudioEncoding.OGG_OPUS,
                     "mp3": AudioEncoding.MP3}
_FILE_FORMATS = {"flac": FileEncoding.FLAC}
# A FLAC file leaves in pieces of this size (an SSE event each, base64).
_FILE_PIECE_BYTES = 256 * 1024
# As OpenAI labels them; pcm is 16-bit little-endian mono at 24 kHz, which is the model's rate.
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "flac": "audio/flac", "wav": "audio/wav",
                 "pcm": "audio/pcm"}
STREAM_FORMATS = ("audio", "sse")
# A value a client sent is quoted back up to this length (a format or model name not served); a longer one is
# described by its length, so that no answer or log line carries it.
_MOST_CHARS_QUOTED = 32
# The fields the shared checks name (the gRPC API's), as this API's parameters.
_PARAMS = {"text": "input", "voice.speaker": "voice", "voice.instruction": "instructions", "voice.voice_id": "voice"}
_HTTP_STATUSES = {
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.UNAUTHENTICATED: 401, grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
# OpenAI's error `type` and `code` for each HTTP status.
_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None), 401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "model_not_found"), 408: ("invalid_request_error", "request_timeout"),
    413: ("invalid_request_error", "request_too_large"), 415: ("invalid_request_error", "unsupported_media_type"),
    429: ("rate_limit_error", "rate_limit_exceeded"), 503: ("server_error", "service_unavailable"),
    504: ("server_error", "timeout"), 500: ("server_error", None),
}
# A body refused with these ends its connection: the rest of it is not worth reading.
_CLOSING_STATUSES = (408, 413)
# A refused body counted under the gRPC status a gRPC call would have ended with, as every call of this door is.
_BODY_REFUSAL_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
                       413: grpc.StatusCode.RESOURCE_EXHAUSTED, 415: grpc.StatusCode.INVALID_ARGUMENT}


@dataclass(frozen=True)
class SpeechRequest:
    text: str
    voice: Any  # qwen3_tts.v1.VoiceSelection
    response_format: str
    stream_format: str


def error_response(error: ApiError) -> web.Response:
    """OpenAI's error JSON, the parameter named, with the HTTP status the gRPC code stands for."""
    param = _PARAMS.get(error.field, error.field) if error.field is not None else None
    message = error.message
    if error.field is not None and param != error.field:
        message = message.replace(f"{error.field}:", f"{param}:", 1)
    headers = {}
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(math.ceil(error.retry_after_s))
    return _openai_error(_HTTP_STATUSES.get(error.code, 500), message, param, headers)


def _openai_error(status: int, message: str, param: str | None, headers: dict[str, str] | None = None,
                  ) -> web.Response:
    kind, code = _ERROR_KINDS[status]
    if status == 404 and param == "voice":
        code = "voice_not_found"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def parse_speech(body: Any, model: ModelInfo, limits: InputLimits) -> SpeechRequest:
    """The JSON body, checked field by field, each against its limit before it is used; every refusal names its
    parameter. Parameters this API does not know are ignored, as OpenAI clients send some."""
    if not isinstance(body, dict):
        raise invalid("body", "must be a JSON object")
    _check_lengths(body, limits)
    requested_model = _string(body, "model", required=True)
    if requested_model not in (model.source, *MODEL_ALIASES):
        raise ApiError(grpc.StatusCode.NOT_FOUND, f"model: {_quoted(requested_model)} is not served here; use "
                       f"{model.source!r} or one of {', '.join(MODEL_ALIASES)}", field="model")
    response_format = _string(body, "response_format") or "mp3"
    if response_format not in CONTENT_TYPES:
        raise invalid("response_format", f"{_quoted(response_format)} is not supported; use one of "
                                         f"{', '.join(CONTENT_TYPES)}")
    stream_format = _string(body, "stream_format") or "audio"
    if stream_format not in STREAM_FORMATS:
        raise invalid("stream_format", f"{_quoted(stream_format)} is not supported; use one of "
                                       f"{', '.join(STREAM_FORMATS)}")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float):
        raise invalid("speed", "must be a number")
    if speed != 1.0:
        raise invalid("speed", "only 1.0 is supported (the model speaks at its own pace)")
    voice = _voice(body, model, _string(body, "instructions") or "")
    return SpeechRequest(_string(body, "input", required=True), voice, response_format, stream_format)


def _check_lengths(body: dict[str, Any], limits: InputLimits) -> None:
    """The free-text parameters against the gRPC API's limits for the fields they become."""
    for param, value, limit in (("input", body.get("input"), limits.text_chars),
                                ("instructions", body.get("instructions"), limits.instruction_chars),
                                ("voice", _voice_name(body), limits.speaker_chars)):
        if isinstance(value, str):
            check_length(param, value, limit)


def _quoted(value: str) -> str:
    return repr(value) if len(value) <= _MOST_CHARS_QUOTED else f"a value of {len(value)} characters"


def _string(body: dict[str, Any], name: str, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise invalid(name, "is required" if value is None else "must be a string")
    return value


def _voice(body: dict[str, Any], model: ModelInfo, instructions: str) -> Any:
    """`voice` as the model's built-in speaker (a name, or OpenAI's {"id": name}); `instructions` as the
    instruction (CustomVoice) or the voice's description (VoiceDesign)."""
    if model.model_type == "voice_design":
        if not instructions.strip():
            raise invalid("instructions", "the loaded voice_design model needs a description of the voice here "
                                          "(`voice` is not used)")
        return pb.VoiceSelection(instruction=instructions)
    voice = _voice_name(body)
    if model.model_type == "base":
        # A clone model speaks in a voice registered over gRPC (CreateVoice): reference audio is not sent here.
        if not isinstance(voice, str) or not voice:
            raise invalid("voice", "is required: the voice_id of a voice registered with CreateVoice")
        return pb.VoiceSelection(voice_id=voice)
    if not isinstance(voice, str) or not voice:
        raise invalid("voice", f"is required: one of {', '.join(model.speakers)}")
    return pb.VoiceSelection(speaker=voice, instruction=instructions)


def _voice_name(body: dict[str, Any]) -> Any:
    """`voice` as a name, or as OpenAI's {"id": name}; anything else as it is, for the checks to refuse."""
    voice = body.get("voice")
    return voice.get("id") if isinstance(voice, dict) else voice


def _metadata(request: web.Request) -> list[tuple[str, str]]:
    """The headers as gRPC metadata: names in lower case (the API key, a traceparent)."""
    return [(name.lower(), value) for name, value in request.headers.items()]


def _peer(request: web.Request) -> str:
    """The client's address in gRPC's spelling, so that a client is one caller through either front door."""
    remote = request.remote or "unknown"
    return f"ipv6:[{remote}]:0" if ":" in remote else f"ipv4:{remote}:0"


def _usage(summary: SynthesisSummary) -> dict[str, int]:
    """Text tokens in, audio frames (the model's output tokens) out."""
    return {"input_tokens": summary.num_text_tokens, "output_tokens": summary.num_frames,
            "total_tokens": summary.num_text_tokens + summary.num_frames}


def _event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class OpenAISpeechApi:
    """The routes, on the speech steps that the gRPC servicer takes too."""

    def __init__(self, steps: SpeechSteps, state: ServingState, config: ServerConfig) -> None:
        self._steps = steps
        self._state = state
        self._config = config
        self._started = int(time.time())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self._config.max_http_body_bytes)
        app.router.add_post(SPEECH_ROUTE.partition(" ")[2], self.speech)
        app.router.add_get("/v1/models", self.models)
        return app

    def _refusal(self, request: web.Request, rpc: str) -> web.Response | None:
        """The answer to a request that may not be served now, counted as refused: not exactly one valid key, or
        the server not serving."""
        try:
            self._steps.credentials.authenticate(_metadata(request))
            if self._state.is_draining:
                raise ApiError(grpc.StatusCode.UNAVAILABLE, "the server is shutting down; retry")
            if not self._state.is_ready or self._steps.engine is None:
                raise ApiError(grpc.StatusCode.UNAVAILABLE, "the server is still loading; retry")
        except ApiError as error:
            self._steps.count_refusal(rpc, error.code)
            return error_response(error)
        return None

    async def models(self, request: web.Request) -> web.Response:
        refusal = self._refusal(request, MODELS_RPC)
        if refusal is not None:
            return refusal
        model = self._steps.engine_or_unavailable().model_info
        # `random_weights` beyond OpenAI's fields: a client can tell a model that speaks from one that makes noise.
        entry = {"id": model.source, "object": "model", "created": self._started, "owned_by": "qwen3-tts-service",
                 "random_weights": model.is_random}
        return web.json_response({"object": "list", "data": [entry]})

    async def speech(self, request: web.Request) -> web.StreamResponse:
        refusal = self._refusal(request, SPEECH_RPC)
        if refusal is not None:
            return refusal
        try:
            body = await read_json(request, self._config.http_body_timeout_seconds)
        except BodyRefused as refused:
            return await self._refused_body(request, refused)
        metadata = _metadata(request)
        identity = self._steps.credentials.identity(metadata, _peer(request))
        response = web.StreamResponse()
        try:
            async with self._steps.speech_call(SPEECH_RPC, identity.caller, metadata, self._ending_status,
                                               http_route=SPEECH_ROUTE) as record:
                response.headers["x-request-id"] = record.request_id
                await self._synthesize(request, response, body, record, identity.owner)
        except ConnectionError:  # the client left mid-write: nobody is left to answer
            logger.info("the client disconnected before its audio was sent")
        except Exception as error:  # every failure of one call ends that call only
            api_error = logged_api_error(error)
            if not response.prepared:
                return error_response(api_error)
            await self._end_broken(request, response, api_error)
        return response

    async def _refused_body(self, request: web.Request, refused: BodyRefused) -> web.Response:
        self._steps.count_refusal(SPEECH_RPC, _BODY_REFUSAL_CODES.get(refused.status, grpc.StatusCode.UNKNOWN))
        response = _openai_error(refused.status, refused.message, refused.param)
        if refused.status in _CLOSING_STATUSES:
            response.force_close()
        if refused.status == 408:
            # aiohttp would go on reading the rest of the body (its lingering time) before closing: a client too
            # slow to send its body is not waited for any longer.
            await response.prepare(request)
            await response.write_eof()
            if request.transport is not None:
                request.transport.close()
        return response

    async def _synthesize(self, request: web.Request, response: web.StreamResponse, body: Any, record: CallRecord,
                          owner: str) -> None:
        steps = self._steps
        speech = parse_speech(body, steps.engine_or_unavailable().model_info, self._config.input_limits)
        prepared = await steps.prepare(record, speech.text, speech.voice, pb.GenerationConfig(), owner)
        # HTTP carries no deadline: the server's limit on a call's life bounds it.
        stream = await steps.submit(prepared, record, None, is_text_open=False)
        try:
            if speech.response_format in _FILE_FORMATS:
                await self._send_file(request, response, speech, stream, record)
            else:
                await self._send_stream(request, response, speech, stream, record)
        finally:
            steps.engine_or_unavailable().abort(record.request_id)

    async def _start(self, request: web.Request, response: web.StreamResponse, speech: SpeechRequest) -> None:
        is_sse = speech.stream_format == "sse"
        response.content_type = "text/event-stream" if is_sse else CONTENT_TYPES[speech.response_format]
        if is_sse:
            response.headers["Cache-Control"] = "no-cache"
        response.enable_chunked_encoding()
        await response.prepare(request)

    async def _send_stream(self, request: web.Request, response: web.StreamResponse, speech: SpeechRequest,
                           stream: RequestStream, record: CallRecord) -> None:
        """WAV, PCM or Opus, written as the engine produces it."""
        output = OutputFormat(_STREAMED_FORMATS[speech.response_format], MODEL_SAMPLE_RATE)
        await self._start(request, response, speech)
        async for piece in self._steps.encoded_audio(stream, output, record):
            if piece.summary is not None and piece.summary.finish_reason is FinishReason.ABORTED:
                raise self._steps.deadline_error(record)
            if piece.chunk is not None:
                await self._write(response, speech, piece.chunk.audio)
            if piece.summary is not None:
                await self._end(response, speech, piece.summary)

    async def _send_file(self, request: web.Request, response: web.StreamResponse, speech: SpeechRequest,
                         stream: RequestStream, record: CallRecord) -> None:
        """FLAC: encoded into a temporary file as the audio comes, sent in pieces once the file is whole."""
        encoder = FileEncoder(_FILE_FORMATS[speech.response_format])
        try:
            summary = await self._steps.written_audio(stream, record, encoder.write)
            file = await asyncio.to_thread(encoder.finish)
            await self._start(request, response, speech)
            while piece := await asyncio.to_thread(file.read, _FILE_PIECE_BYTES):
                await self._write(response, speech, piece)
            await self._end(response, speech, summary)
        finally:
            encoder.close()

    @staticmethod
    async def _write(response: web.StreamResponse, speech: SpeechRequest, audio: bytes) -> None:
        if speech.stream_format == "sse":
            await response.write(_event({"type": "speech.audio.delta", "audio": base64.b64encode(audio).decode()}))
        else:
            await response.write(audio)

    @staticmethod
    async def _end(response: web.StreamResponse, speech: SpeechRequest, summary: SynthesisSummary) -> None:
        if speech.stream_format == "sse":
            await response.write(_event({"type": "speech.audio.done", "usage": _usage(summary)}))
        await response.write_eof()

    @staticmethod
    async def _end_broken(request: web.Request, response: web.StreamResponse, error: ApiError) -> None:
        """A call that fails once its audio has started: an SSE stream says why in an `error` event; an audio body
        is cut short (its connection closed before the chunked body's end), so that no client takes it for whole."""
        if response.content_type == "text/event-stream":
            body = json.loads(error_response(error).text or "{}")
            await response.write(_event({"type": "error", **body}))
            await response.write_eof()
        elif request.transport is not None:
            request.transport.close()

    def _ending_status(self, record: CallRecord, error: BaseException) -> str:
        client_gone = (asyncio.CancelledError, GeneratorExit, ConnectionError)
        return ending_status_name(error, self._steps.was_expired(record), client_gone)
