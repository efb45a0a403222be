"""The WebSocket door on the HTTP port, in two dialects, on the speech steps every door takes (`speech.SpeechSteps`):
the same API keys, per-caller limit, input limits, metrics, spans and logs as a gRPC StreamingSynthesize call.

- `GET /v1/speech/stream`: this service's own JSON dialect (docs/websocket.md), StreamingSynthesize over a
  WebSocket. Each JSON message becomes the qwen3_tts.v1 request message it stands for (protobuf's JSON parser, so
  that fields and their checks are the proto's), and the call runs through gRPC's own `text_call.TextCall`: the
  same checks, error texts and limits. Its responses go back as JSON.
- `GET /v1/text-to-speech/{voice_id}/multi-stream-input`: ElevenLabs' multi-context protocol, for Pipecat's and
  LiveKit's ElevenLabs plugins (`elevenlabs_dialect`), on the same utterances (`utterances.UtteranceCall`).

A socket is one call: its frame (`SpeechSteps.speech_call`) holds one of its caller's places from the upgrade to
the close, so that a caller's idle sockets count against `--max-calls-per-caller`, and the connection caps of the
HTTP port (`http_connections`) bound the rest. Everything that can be refused before the upgrade is (a key, a
voice, a format, a busy caller), with an HTTP status: a client learns of it where it connects. Later errors are an
error message naming the field, then a close code: 1007 for a message that is not JSON or has a field of the wrong
type, 1003 for a binary frame, 1009 (aiohttp's own) for a frame over `--max-http-body-bytes`, 1008 for any other
refused message and for the idle and lifetime limits, 1013 for a busy or draining server, 1011 for a failure inside
it. Sends wait for the socket to drain, so audio a client leaves unread stays in the engine's stream and pauses its
request, as gRPC's flow control does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from aiohttp import WSCloseCode, WSMsgType, web
from google.protobuf import json_format

from observability.calls import CallRecord
from qwen3_tts.v1.protocol import tts_pb2
from tts_service.api import elevenlabs_dialect
from tts_service.api.call_limits import next_message
from tts_service.api.callers import CREDENTIAL_HEADERS, ELEVENLABS_CREDENTIAL_HEADERS, Identity
from tts_service.api.config import ServerConfig
from tts_service.api.elevenlabs_dialect import ElevenLabsCall, client_message, stream_options
from tts_service.api.errors import ApiError, api_error_for, ending_status_name, invalid, logged_api_error
from tts_service.api.http_body import BodyRefused, parse_json
from tts_service.api.interceptors import MAX_BYTES_PARSED_ON_LOOP, ServingState
from tts_service.api.messages import completion, output_format
from tts_service.api.speech import SpeechSteps
from tts_service.api.text_call import TextCall, first_config
from tts_service.api.utterances import UtteranceCall
from tts_service.api.word_timestamps import check_word_timestamps
from tts_service.engine import SynthesisSummary

logger = logging.getLogger("tts_service.api.server")

pb: Any = tts_pb2
SPEECH_STREAM_ROUTE = "/v1/speech/stream"
SPEECH_STREAM_RPC = "WebSocketSpeech"
ELEVENLABS_RPC = "ElevenLabsStreamInput"
REQUEST_ID_HEADER = "x-request-id"
# How long a closing handshake waits for the client's answer (or for a client that reads nothing to take the frame).
CLOSE_TIMEOUT_S = 2.0
# What each of this dialect's message types may carry beside `type`, as the qwen3_tts.v1 request's fields.
_OWN_FIELDS = {"text": ("text", "utterance_id"), "flush": ("marker", "utterance_id"),
               "close": ("utterance_id",), "cancel": ("utterance_id",), "end": ()}
# As the OpenAI door answers them.
_HTTP_STATUSES = {
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.UNAUTHENTICATED: 401, grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
_CLOSE_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT: WSCloseCode.POLICY_VIOLATION,
    grpc.StatusCode.NOT_FOUND: WSCloseCode.POLICY_VIOLATION,
    grpc.StatusCode.DEADLINE_EXCEEDED: WSCloseCode.POLICY_VIOLATION,
    grpc.StatusCode.UNAUTHENTICATED: WSCloseCode.POLICY_VIOLATION,
    grpc.StatusCode.RESOURCE_EXHAUSTED: WSCloseCode.TRY_AGAIN_LATER,
    grpc.StatusCode.UNAVAILABLE: WSCloseCode.TRY_AGAIN_LATER,
}


class ClientClosed(Exception):
    """The client closed the socket (or it dropped) before the call's end."""


class MalformedMessage(ApiError):
    """A message that cannot be read as this dialect's: it ends the call with `close_code`."""

    def __init__(self, close_code: int, field: str, message: str) -> None:
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {message}", field=field)
        self.close_code = close_code


@dataclass(frozen=True)
class Dialect:
    rpc: str
    route: str  # as spans name it
    credential_headers: tuple[str, ...]
    http_error: Callable[[ApiError], web.Response]  # an error before the upgrade
    error_message: Callable[[ApiError], dict[str, Any]]  # an error on the socket


def _own_error(error: ApiError) -> dict[str, Any]:
    return {"type": "error", "code": error.code.name, "field": error.field, "message": error.message}


def _elevenlabs_error(error: ApiError) -> dict[str, Any]:
    return elevenlabs_dialect.error_message(error, None)


def _own_http_error(error: ApiError) -> web.Response:
    return _http_error(error, _own_error(error))


def _elevenlabs_http_error(error: ApiError) -> web.Response:
    # ElevenLabs' own error body.
    return _http_error(error, {"detail": {"status": error.code.name.lower(), "message": error.message}})


def _http_error(error: ApiError, body: dict[str, Any]) -> web.Response:
    return web.json_response(body, status=_HTTP_STATUSES.get(error.code, 500))


OWN = Dialect(SPEECH_STREAM_RPC, f"GET {SPEECH_STREAM_ROUTE}", CREDENTIAL_HEADERS, _own_http_error, _own_error)
ELEVENLABS = Dialect(ELEVENLABS_RPC, f"GET {elevenlabs_dialect.ROUTE}", ELEVENLABS_CREDENTIAL_HEADERS,
                     _elevenlabs_http_error, _elevenlabs_error)


def close_code(error: Exception) -> int:
    if isinstance(error, MalformedMessage):
        return error.close_code
    api_error = api_error_for(error)
    return _CLOSE_CODES.get(api_error.code, WSCloseCode.INTERNAL_ERROR) if api_error is not None else \
        WSCloseCode.INTERNAL_ERROR


class Socket:
    """A prepared WebSocket: its messages as parsed JSON, and JSON sent in its turn."""

    def __init__(self, request: web.Request, max_bytes: int) -> None:
        self.request = request
        # No compression: inflating a client's frames would run on the event loop, and audio does not deflate.
        self.ws = web.WebSocketResponse(max_msg_size=max_bytes, compress=False, timeout=CLOSE_TIMEOUT_S)
        self._max_bytes = max_bytes

    def messages(self, parse: Callable[[Any], Any] = lambda body: body) -> AsyncIterator[Any]:
        """Each text frame's JSON, `parse`d. Waiting for one may be cancelled and begun again (the idle limit's
        wait is), as nothing is held between frames."""
        return _Messages(self, parse)

    async def next_json(self) -> Any:
        """The next text frame's JSON; ClientClosed once the client closes, MalformedMessage for what is not
        JSON."""
        while True:
            message = await self.ws.receive()
            if message.type is WSMsgType.TEXT:
                return await _parsed(message.data)
            elif message.type is WSMsgType.BINARY:
                raise MalformedMessage(WSCloseCode.UNSUPPORTED_DATA, "message",
                                       "must be a text frame holding a JSON object; binary frames are not accepted")
            elif message.type is WSMsgType.ERROR and self.ws.close_code == WSCloseCode.MESSAGE_TOO_BIG:
                raise MalformedMessage(WSCloseCode.MESSAGE_TOO_BIG, "message", f"is larger than {self._max_bytes} "
                                       "bytes, the most the server reads (--max-http-body-bytes)")
            else:  # closed, closing, or a frame aiohttp could not read (it has closed the socket)
                raise ClientClosed

    async def send(self, payload: dict[str, Any]) -> None:
        """Waits while the client has not read what was sent before (beyond aiohttp's small write buffer)."""
        await self.ws.send_str(json.dumps(payload, separators=(",", ":")))

    async def fail(self, payload: dict[str, Any], code: int) -> None:
        """An error message, then the close; either may find the client gone."""
        with contextlib.suppress(ConnectionError, RuntimeError):
            await asyncio.wait_for(self.send(payload), CLOSE_TIMEOUT_S)
        await self.close(code, payload.get("message", ""))

    async def close(self, code: int = WSCloseCode.OK, reason: str = "") -> None:
        """The closing handshake, within CLOSE_TIMEOUT_S; a client that takes no frame is cut off."""
        try:
            # A close frame's reason holds at most 123 bytes.
            await asyncio.wait_for(self.ws.close(code=code, message=reason.encode()[:123]), CLOSE_TIMEOUT_S)
        except (TimeoutError, ConnectionError):
            if self.request.transport is not None:
                self.request.transport.abort()


class _Messages:
    def __init__(self, socket: Socket, parse: Callable[[Any], Any]) -> None:
        self._socket = socket
        self._parse = parse

    def __aiter__(self) -> _Messages:
        return self

    async def __anext__(self) -> Any:
        return self._parse(await self._socket.next_json())


async def _parsed(data: str) -> Any:
    raw = data.encode()
    try:
        return parse_json(raw) if len(raw) <= MAX_BYTES_PARSED_ON_LOOP else await asyncio.to_thread(parse_json, raw)
    except BodyRefused as refused:
        raise MalformedMessage(WSCloseCode.INVALID_TEXT, "message",
                               refused.message.removeprefix("body: ")) from None


class WebSocketDoor:
    """Both dialects' routes, on the speech steps the other doors take too."""

    def __init__(self, steps: SpeechSteps, state: ServingState, config: ServerConfig) -> None:
        self._steps = steps
        self._state = state
        self._config = config

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(SPEECH_STREAM_ROUTE, self.speech_stream)
        app.router.add_get(elevenlabs_dialect.ROUTE, self.elevenlabs_stream)

    async def speech_stream(self, request: web.Request) -> web.StreamResponse:
        return await self._call(request, OWN, self._speak)

    async def elevenlabs_stream(self, request: web.Request) -> web.StreamResponse:
        return await self._call(request, ELEVENLABS, self._speak_elevenlabs)

    # -- the call's frame, either dialect -------------------------------------------------------------

    async def _call(self, request: web.Request, dialect: Dialect,
                    run: Callable[[Socket, CallRecord, Identity], Awaitable[None]]) -> web.StreamResponse:
        metadata = [(name.lower(), value) for name, value in request.headers.items()]
        socket = Socket(request, self._config.max_http_body_bytes)
        try:
            identity = self._admitted(metadata, request, dialect)
            if not socket.ws.can_prepare(request).ok:
                raise invalid("upgrade", "this route speaks WebSocket only: send a WebSocket upgrade request")
        except ApiError as error:
            self._steps.count_refusal(dialect.rpc, error.code)
            return dialect.http_error(error)
        try:
            async with self._steps.speech_call(dialect.rpc, identity.caller, metadata, self._ending_status,
                                               http_route=dialect.route) as record:
                socket.ws.headers[REQUEST_ID_HEADER] = record.request_id
                await run(socket, record, identity)
        except (ClientClosed, ConnectionError):
            logger.info("the client closed its WebSocket before the call's end")
            return socket.ws
        except Exception as error:  # every failure of one call ends that call only
            api_error = logged_api_error(error)
            if not socket.ws.prepared:
                return dialect.http_error(api_error)
            await socket.fail(dialect.error_message(api_error), close_code(error))
            return socket.ws
        await socket.close()
        return socket.ws

    def _admitted(self, metadata: list[tuple[str, str]], request: web.Request, dialect: Dialect) -> Identity:
        """The caller of a call that may be served now: exactly one valid key, and the server serving."""
        identity = self._steps.credentials.identity(metadata, _peer(request), dialect.credential_headers)
        if self._state.is_draining:
            raise ApiError(grpc.StatusCode.UNAVAILABLE, "the server is shutting down; retry")
        if not self._state.is_ready or self._steps.engine is None:
            raise ApiError(grpc.StatusCode.UNAVAILABLE, "the server is still loading; retry")
        return identity

    def _ending_status(self, record: CallRecord, error: BaseException) -> str:
        client_gone = (asyncio.CancelledError, ClientClosed, ConnectionError)
        return ending_status_name(error, self._steps.was_expired(record), client_gone)

    def _time_left(self, started: float) -> Callable[[], float]:
        """The rest of the socket's life (--max-stream-seconds from its start), which bounds every utterance."""
        return lambda: max(0.0, self._config.max_stream_seconds - (time.monotonic() - started))

    def _completion(self, summary: SynthesisSummary) -> Any:
        model = self._steps.engine_or_unavailable().model_info
        return completion(summary, model.samples_per_frame, model.sample_rate)

    # -- this service's own dialect -------------------------------------------------------------------

    async def _speak(self, socket: Socket, record: CallRecord, identity: Identity) -> None:
        """StreamingSynthesize, as the gRPC servicer runs it, on JSON messages."""
        await socket.ws.prepare(socket.request)
        started = time.monotonic()
        requests = own_requests(socket.messages())
        config = await first_config(requests, self._config)
        output = output_format(config.audio_format)
        utterances = await UtteranceCall.start(self._steps, record, identity, config, output,
                                               self._time_left(started))
        call = TextCall(self._config, utterances, started, self._completion)
        async for response in call.responses(requests):
            for payload in own_messages(response):
                await socket.send(payload)

    # -- ElevenLabs' dialect --------------------------------------------------------------------------

    async def _speak_elevenlabs(self, socket: Socket, record: CallRecord, identity: Identity) -> None:
        engine = self._steps.engine_or_unavailable()
        request = socket.request
        options = stream_options(request.match_info["voice_id"], request.query, engine.model_info)
        # Checked before the upgrade too: a registered voice another key owns is a 404 where the client connects.
        prepared = await self._steps.prepare(record, "", options.voice, pb.GenerationConfig(), identity.owner,
                                             is_text_streamed=True)
        await socket.ws.prepare(request)
        started = time.monotonic()
        utterances = UtteranceCall(self._steps, record, identity.caller, prepared, options.output,
                                   self._time_left(started), self._word_timestamps_language(options.voice))
        call = ElevenLabsCall(utterances, options)
        limits = self._config
        if options.inactivity_timeout_s is not None:  # the client's own idle limit, within the server's
            limits = dataclasses.replace(limits, stream_idle_timeout_seconds=min(
                options.inactivity_timeout_s, limits.stream_idle_timeout_seconds))
        reader = asyncio.create_task(self._read_elevenlabs(socket, call, limits, started))
        try:
            async for item in utterances.items(reader):
                for payload in call.messages(item):
                    await socket.send(payload)
        finally:
            reader.cancel()
            await utterances.aclose()
            await asyncio.gather(reader, return_exceptions=True)

    def _word_timestamps_language(self, voice: Any) -> str | None:
        """Words are timed (and sent as alignment) whenever the server has an aligner for the voice's language."""
        try:
            check_word_timestamps(self._steps.aligner, voice.language, "language_code")
        except ApiError:
            return None
        return voice.language

    @staticmethod
    async def _read_elevenlabs(socket: Socket, call: ElevenLabsCall, limits: ServerConfig, started: float) -> None:
        """Client messages -> the contexts, until close_socket, or the client's close with no context open (how
        LiveKit ends); a close with contexts open ends the call at once. The idle limit holds while the client owes
        the server text, not while it waits for a turn it has ended (it may send nothing then): a turn's audio may
        take longer than the limit to make and read."""
        messages = socket.messages(client_message)
        try:
            while True:
                try:
                    message = await next_message(messages, limits, started)
                except ApiError:
                    if call.is_owed_audio and time.monotonic() - started < limits.max_stream_seconds:
                        continue  # idle, but waiting for audio
                    raise
                if message is None or not await call.apply(message):
                    return
        except ClientClosed:
            if call.has_open_contexts:
                raise
        call.end(cancel_unfinished=True)


def own_requests(messages: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """This dialect's JSON messages as qwen3_tts.v1 StreamingSynthesizeRequest messages, until `end`."""

    async def requests() -> AsyncIterator[Any]:
        async for body in messages:
            request = own_request(body)
            if request is None:
                return
            yield request

    return requests()


def own_request(body: Any) -> Any | None:
    """One JSON message as the StreamingSynthesizeRequest it stands for; None for `end`. Fields are parsed by
    protobuf's JSON parser, so that a config takes exactly the fields (and names) of StreamingSynthesizeConfig."""
    if not isinstance(body, dict):
        raise MalformedMessage(WSCloseCode.INVALID_TEXT, "message", "must be a JSON object")
    kind = body.get("type")
    if kind == "config":
        return _parse({"config": {name: value for name, value in body.items() if name != "type"}}, "config.")
    if not isinstance(kind, str) or kind not in _OWN_FIELDS:
        raise invalid("type", f"must be one of config, {', '.join(_OWN_FIELDS)}")
    unknown = sorted(set(body) - {"type", *_OWN_FIELDS[kind]})
    if unknown:
        raise invalid(unknown[0][:32], f"is not a field of a {kind} message")
    if kind == "end":
        return None
    fields = {"utterance_id": body.get("utterance_id", "")}
    if kind == "text":
        fields["text"] = body.get("text")
    elif kind == "flush":
        fields["flush"] = {"marker": body.get("marker", "")}
    else:
        fields[f"{kind}_utterance"] = {}
    return _parse(fields, "")


def _parse(fields: dict[str, Any], prefix: str) -> Any:
    try:
        return json_format.ParseDict(fields, pb.StreamingSynthesizeRequest())
    except json_format.ParseError as error:
        field = _parse_error_field(str(error), prefix)
        raise MalformedMessage(WSCloseCode.INVALID_TEXT, field, "is not a field of this message, or its value "
                                                                "has the wrong type or range") from None


def _parse_error_field(text: str, prefix: str) -> str:
    """The field protobuf's parser names: the path after "at" ("... at StreamingSynthesizeConfig.generation.top_k")
    or else its chain of "Failed to parse voice field: Failed to parse speaker field: ...", and an unknown field's
    name ('has no field named "spk"'). The config's own level is dropped: gRPC's errors name its fields from there
    (voice.speaker)."""
    path = re.search(r'\bat "?[A-Za-z]\w*((?:\.\w+)*)"?\.', text)
    names = path[1].split(".")[1:] if path is not None and path[1] else re.findall(r"Failed to parse (\w+) field", text)
    unknown = re.search(r'has no field named "(\w{1,32})"', text)
    if unknown is not None:
        names.append(unknown[1])
    if prefix and names[:1] == [prefix.rstrip(".")]:
        names = names[1:]
    return ".".join(names) or prefix.rstrip(".") or "message"


def own_messages(response: Any) -> list[dict[str, Any]]:
    """A StreamingSynthesizeResponse as this dialect's messages: audio, timed words, then a completion; or a flush
    ack."""
    utterance_id = response.utterance_id
    if response.HasField("flush_ack"):
        return [{"type": "flush_ack", "utterance_id": utterance_id, "marker": response.flush_ack.marker}]
    out: list[dict[str, Any]] = []
    chunk = response.chunk
    if response.HasField("chunk"):
        out.append({"type": "audio", "utterance_id": utterance_id, "audio": base64.b64encode(chunk.audio).decode(),
                    "offset_samples": chunk.offset_samples, "num_samples": chunk.num_samples,
                    "offset_seconds": chunk.offset_seconds, "duration_seconds": chunk.duration_seconds})
    if response.HasField("words"):
        out.append({"type": "words", "utterance_id": utterance_id, "words": [
            {"word": word.word, "start_char": word.start_char, "end_char": word.end_char,
             "start_seconds": word.start_seconds, "end_seconds": word.end_seconds} for word in response.words.words]})
    if response.HasField("completion"):
        body = json_format.MessageToDict(response.completion, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)
        out.append({"type": "completion", "utterance_id": utterance_id, **body})
    return out


def _peer(request: web.Request) -> str:
    """The client's address in gRPC's spelling, as the OpenAI door writes it: one client, one caller, any door."""
    remote = request.remote or "unknown"
    return f"ipv6:[{remote}]:0" if ":" in remote else f"ipv4:{remote}:0"
