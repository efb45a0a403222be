"""The gRPC server: the public API (proto/qwen3_tts/v1/tts.proto) translated to and from the engine.

The servicer only translates: requests become the shared speech steps' terms (`speech.py`), their errors become
status codes, audio pieces become response messages. The engine owns scheduling. Around the servicer sit the
standard gRPC health service (NOT_SERVING until the engine runs, and again while draining), server reflection (so
grpcurl needs no .proto), an API-key check and an admission check that answers UNAVAILABLE while the server is
starting or draining (`interceptors.py`). Which status an error becomes is `errors.py`; how messages become engine
terms and back is `messages.py`; the bidirectional call's reading, flush acks and limits are `text_call.py`.

`TtsServer` builds the speech steps once and hands them to both front doors: this servicer and, when its port is
set, the OpenAI-compatible HTTP API (`openai_http.py`), which knows nothing of gRPC's servicer. Every handler runs
on the event loop's thread, as the engine requires: gRPC's asyncio server runs each one there. The servicer talks
to the engine's public methods only, never to its runner or scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client.exposition import choose_encoder

from observability.calls import CallRecord
from observability.metrics import LiveState, ServiceMetrics
from observability.tracing import CallTracer
from qwen3_tts.v1.protocol import SERVICE_NAME, tts_pb2, tts_pb2_grpc
from tts_service.api.callers import Credentials
from tts_service.api.config import ServerConfig
from tts_service.api.errors import answering_errors
from tts_service.api.http_connections import ConnectionGuard, ConnectionLimits, bound_http_logs
from tts_service.api.interceptors import (
    AdmissionInterceptor,
    ApiKeyInterceptor,
    RequestParsingInterceptor,
    ServingState,
)
from tts_service.api.lexicon_store import RegisteredLexicon
from tts_service.api.messages import (
    ENCODING_NUMBERS,
    completion,
    lexicon_message,
    lexicon_of,
    output_format,
    output_formats,
    word_timings,
)
from tts_service.api.openai_http import OpenAISpeechApi
from tts_service.api.speech import CallTracker, EndingStatus, SpeechSteps
from tts_service.api.text_call import TextCall, first_config
from tts_service.api.utterances import UtteranceCall
from tts_service.api.voices import (
    check_can_create_voices,
    check_create_limits,
    check_voice_id,
    fields_at_top_level,
    not_found,
    registered_voice_message,
)
from tts_service.api.websocket_door import WebSocketDoor
from tts_service.api.word_timestamps import TimedWord, WordTracker, word_timestamps_language
from tts_service.audio.output import OutputFormat, encode_whole
from tts_service.engine import EngineDoor, ModelInfo, RequestStream, SynthesisSummary, VoiceNotFoundError

logger = logging.getLogger(__name__)

pb: Any = tts_pb2
REQUEST_ID_HEADER = "x-request-id"
# How long a drained server waits for ended calls' last messages to reach their clients.
_FLUSH_GRACE_S = 5.0
_MODEL_MODES = {
    "custom_voice": pb.MODEL_MODE_CUSTOM_VOICE, "voice_design": pb.MODEL_MODE_VOICE_DESIGN,
    "base": pb.MODEL_MODE_VOICE_CLONE,
}


# -- the servicer ---------------------------------------------------------------------------------


class TextToSpeechService(tts_pb2_grpc.TextToSpeechServicer):
    """The gRPC API: each call's messages into the shared speech steps' terms, and their answers and errors back
    into messages and statuses."""

    def __init__(self, steps: SpeechSteps) -> None:
        self._steps = steps
        self._config = steps.config

    @contextlib.asynccontextmanager
    async def _call(self, rpc: str, context: grpc.aio.ServicerContext) -> AsyncIterator[CallRecord]:
        """A gRPC speech call's frame: the shared one, with errors as statuses and the request id as a header."""
        caller = self._steps.credentials.identity_of(context).caller
        metadata = context.invocation_metadata() or ()
        async with self._steps.speech_call(rpc, caller, metadata, self._grpc_status(context),
                                           answering_errors(context)) as record:
            await context.send_initial_metadata(((REQUEST_ID_HEADER, record.request_id),))
            yield record

    def _grpc_status(self, context: grpc.aio.ServicerContext) -> EndingStatus:
        def status(record: CallRecord, error: BaseException) -> str:
            if isinstance(error, grpc.aio.AbortError):
                code = context.code()
                return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
            # The call ended under the handler: the client went away, its deadline passed, or the server's limit.
            remaining_s = context.time_remaining()
            is_past_deadline = remaining_s is not None and remaining_s <= 0
            return "DEADLINE_EXCEEDED" if is_past_deadline or self._steps.was_expired(record) else "CANCELLED"

        return status

    # ListVoices

    async def ListVoices(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with answering_errors(context):
            engine = self._steps.engine_or_unavailable()
            response = self._voices(engine.model_info)
            registered = await engine.registered_voices(self._owner(context))
            response.registered_voices.extend(registered_voice_message(voice) for voice in registered)
            return response

    def _voices(self, model: ModelInfo) -> Any:
        speakers = [pb.Speaker(name=name, dialect=model.speaker_dialects[name] or "") for name in model.speakers]
        config, engine = self._config, self._config.engine
        limits = pb.Limits(max_text_chars=engine.max_text_chars, max_audio_seconds=engine.max_audio_s,
                           max_reference_audio_seconds=engine.max_reference_audio_s,
                           max_message_bytes=config.max_message_bytes,
                           max_reference_text_chars=engine.max_reference_text_chars,
                           max_reference_audio_bytes=config.input_limits.reference_audio_bytes,
                           max_calls_per_caller=config.max_calls_per_caller,
                           max_voices=engine.max_voices, max_voices_per_caller=engine.max_voices_per_owner,
                           max_utterances_per_call=config.max_utterances_per_call,
                           max_lexicons=config.max_lexicons, max_lexicons_per_caller=config.max_lexicons_per_caller,
                           max_document_chars=engine.max_document_chars, max_segment_chars=engine.segment_chars,
                           max_document_audio_seconds=engine.max_document_audio_s,
                           max_voice_bytes=engine.max_voice_bytes,
                           voices_are_persistent=engine.voice_store_dir is not None,
                           stream_idle_timeout_seconds=config.stream_idle_timeout_seconds,
                           max_stream_seconds=config.max_stream_seconds)
        return pb.ListVoicesResponse(
            model=model.source, mode=_MODEL_MODES.get(model.model_type, pb.MODEL_MODE_UNSPECIFIED),
            model_size=model.model_size, speakers=speakers, languages=list(model.languages),
            accepts_instruction=model.accepts_instruction, supports_in_context_clone=model.can_clone_in_context,
            random_weights=model.is_random, native_sample_rate=model.sample_rate, output_formats=output_formats(),
            limits=limits)

    # Registered voices

    async def CreateVoice(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self._call("CreateVoice", context) as record:
            engine = self._steps.engine_or_unavailable()
            check_can_create_voices(engine.model_info)
            check_create_limits(request, self._config.input_limits)
            owner = self._owner(context)
            with fields_at_top_level():
                voice = await self._steps.encode_reference(engine, request, record, lambda wav: engine.create_voice(
                    wav, request.reference_text or None, request.x_vector_only, owner))
            logger.info("created voice %s (%s, %.2f s of reference)", voice.voice_id, voice.kind.value,
                        voice.reference_seconds)
            return registered_voice_message(voice)

    async def GetVoice(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with answering_errors(context):
            check_voice_id("voice_id", request.voice_id)
            voice = await self._steps.registered_voice(self._steps.engine_or_unavailable(), request.voice_id,
                                                       self._owner(context), "voice_id")
            return registered_voice_message(voice)

    async def DeleteVoice(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with answering_errors(context):
            check_voice_id("voice_id", request.voice_id)
            try:
                await self._steps.engine_or_unavailable().delete_voice(request.voice_id, self._owner(context))
            except VoiceNotFoundError:
                raise not_found("voice_id", request.voice_id) from None
            logger.info("deleted voice %s", request.voice_id)
            return pb.DeleteVoiceResponse()

    # Registered lexicons: kept by the front door (they change only the text it hands the engine).

    async def CreateLexicon(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with answering_errors(context):
            lexicon = lexicon_of(request.lexicon, "lexicon")
            store = self._steps.lexicons
            lexicon_id = await asyncio.to_thread(store.create, self._owner(context), lexicon)
            logger.info("created lexicon %s (%d entries)", lexicon_id, len(lexicon.entries))
            return registered_lexicon_message(store.get(self._owner(context), lexicon_id))

    async def GetLexicon(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with answering_errors(context):
            return registered_lexicon_message(self._steps.lexicons.get(self._owner(context), request.lexicon_id))

    async def ListLexicons(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with answering_errors(context):
            return pb.ListLexiconsResponse(lexicons=[registered_lexicon_message(registered)
                                                     for registered in self._steps.lexicons.list(self._owner(context))])

    async def DeleteLexicon(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with answering_errors(context):
            await asyncio.to_thread(self._steps.lexicons.delete, self._owner(context), request.lexicon_id)
            logger.info("deleted lexicon %s", request.lexicon_id)
            return pb.DeleteLexiconResponse()

    def _owner(self, context: grpc.aio.ServicerContext) -> str:
        return self._steps.credentials.identity_of(context).owner

    # Synthesize

    async def Synthesize(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with self._call("Synthesize", context) as record:
            output = output_format(request.audio_format)
            stream, words = await self._start_whole_text(record, request, context)
            waveform, summary = await self._steps.whole_audio(stream, record)
            audio = await asyncio.to_thread(encode_whole, waveform, output)
            timed: tuple[TimedWord, ...] = ()
            if words is not None:
                words.add_audio(waveform, is_last=True)
                await words.finish()
                timed = words.take_words()
            return pb.SynthesizeResponse(
                audio=audio, mime_type=output.mime_type, completion=self._completion(summary),
                audio_format=pb.AudioFormat(encoding=ENCODING_NUMBERS[output.encoding],
                                            sample_rate=output.sample_rate), words=word_timings(timed))

    # SynthesizeOnline

    async def SynthesizeOnline(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async with self._call("SynthesizeOnline", context) as record:
            output = output_format(request.audio_format)
            stream, words = await self._start_whole_text(record, request, context)
            try:
                async for message in self._audio_messages(stream, output, pb.SynthesizeOnlineResponse, record,
                                                          words):
                    if message.HasField("completion") and message.completion.finish_reason == pb.FINISH_REASON_ABORTED:
                        raise self._steps.deadline_error(record)
                    yield message
            finally:
                self._steps.engine_or_unavailable().abort(record.request_id)

    async def _audio_messages(self, stream: RequestStream, output: OutputFormat, message_type: Any,
                              record: CallRecord, words: WordTracker | None = None) -> AsyncGenerator[Any, None]:
        """The stream's audio (and timed words) as response messages; the last one carries the completion."""
        async for piece in self._steps.encoded_audio(stream, output, record, words):
            if piece.words:
                yield message_type(words=pb.WordTimestamps(words=word_timings(piece.words)))
                continue
            if piece.summary is None:
                yield message_type(chunk=piece.chunk)
                continue
            last = message_type(completion=self._completion(piece.summary))
            if piece.chunk is not None:
                last.chunk.CopyFrom(piece.chunk)
            yield last

    # StreamingSynthesize

    async def StreamingSynthesize(self, request_iterator: AsyncIterator[Any],
                                  context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async with self._call("StreamingSynthesize", context) as record:
            started = time.monotonic()
            config = await first_config(request_iterator, self._config)
            output = output_format(config.audio_format)
            identity = self._steps.credentials.identity_of(context)
            utterances = await UtteranceCall.start(self._steps, record, identity, config, output,
                                                   context.time_remaining)
            call = TextCall(self._config, utterances, started, self._completion)
            async for message in call.responses(request_iterator):
                yield message

    async def _start_whole_text(self, record: CallRecord, request: Any,
                                context: grpc.aio.ServicerContext) -> tuple[RequestStream, WordTracker | None]:
        """A Synthesize or SynthesizeOnline request, checked and queued, with its lexicon applied; and its word
        timings to come, when it asked for them."""
        owner = self._owner(context)
        language = word_timestamps_language(self._steps.aligner, request, "word_timestamps")
        lexicon = self._steps.request_lexicon(request, owner)
        substituted = None if lexicon is None else lexicon.apply(request.text)
        spoken = request.text if substituted is None else substituted.spoken
        prepared = await self._steps.prepare(record, request.text, request.voice, request.generation, owner, spoken)
        words = None if language is None else self._steps.word_tracker(language, spoken, True, substituted,
                                                                         request.text)
        return await self._steps.submit(prepared, record, context.time_remaining(), is_text_open=False), words

    def _completion(self, summary: SynthesisSummary) -> Any:
        model = self._steps.engine_or_unavailable().model_info
        return completion(summary, model.samples_per_frame, model.sample_rate)


# -- the server -----------------------------------------------------------------------------------


def registered_lexicon_message(registered: RegisteredLexicon) -> Any:
    return pb.RegisteredLexicon(lexicon_id=registered.lexicon_id, lexicon=lexicon_message(registered.lexicon),
                                created_at=registered.created_at)


def watch_engine(metrics: ServiceMetrics, engine: EngineDoor) -> None:
    """Engine steps into the metrics, and gauges that read the engine's load when scraped."""
    engine.add_step_observer(metrics.observe_step)
    metrics.set_cuda_graphs(engine.captured_graph_batch_sizes())
    metrics.watch(LiveState(num_running=lambda: engine.occupancy().num_running,
                            num_waiting=lambda: engine.occupancy().num_waiting,
                            num_parked=lambda: engine.occupancy().num_parked,
                            num_preemptions_total=lambda: engine.occupancy().num_preemptions_total,
                            num_kv_blocks_used=lambda: engine.occupancy().num_kv_blocks_used,
                            num_kv_blocks_total=lambda: engine.occupancy().num_kv_blocks_total,
                            num_cores_running=lambda: engine.num_cores_running))


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    if config.tls_cert is None or config.tls_key is None:
        return None
    client_ca = config.tls_client_ca.read_bytes() if config.tls_client_ca is not None else None
    return grpc.ssl_server_credentials([(config.tls_key.read_bytes(), config.tls_cert.read_bytes())],
                                       root_certificates=client_ca, require_client_auth=client_ca is not None)


def http_handler_options(config: ServerConfig) -> dict[str, Any]:
    """aiohttp's protocol on an HTTP port: a silent connection closes at the keep-alive timeout, and a compressed
    body stays as it came (and is refused), since decompressing would run on the event loop to a size unknown before."""
    return {"access_log": None, "keepalive_timeout": config.http_keepalive_timeout_seconds, "auto_decompress": False}


def http_runner(app: web.Application, config: ServerConfig, **options: Any) -> web.AppRunner:
    return web.AppRunner(app, **http_handler_options(config), **options)


def http_tls(config: ServerConfig) -> ssl.SSLContext | None:
    """The gRPC port's TLS (and mTLS) for the HTTP API too: its API keys must not cross the network in clear."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert, config.tls_key)
    if config.tls_client_ca is not None:
        context.load_verify_locations(config.tls_client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class TtsServer:
    """The listening server: start() it, serve() an engine once it runs, shutdown() to drain and stop.

    Create it inside a running event loop.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.state = ServingState()
        self.calls = CallTracker(config.max_calls_per_caller)
        self.health = health.aio.HealthServicer()
        credentials = Credentials(config.api_keys)
        # Built once, for both front doors: one engine, one set of limits and metrics, whichever door a call takes.
        self.steps = SpeechSteps(config, self.calls, credentials, self.state)
        self.service = TextToSpeechService(self.steps)
        count_refusal = self.steps.count_refusal
        interceptors: list[grpc.aio.ServerInterceptor] = [AdmissionInterceptor(self.state, count_refusal),
                                                          RequestParsingInterceptor()]
        if credentials.is_required:
            interceptors.insert(0, ApiKeyInterceptor(credentials, count_refusal))
        # Without SO_REUSEPORT, which gRPC sets by default: with it, a second server binds a port already in use
        # and silently takes a share of its new connections. Connections are capped and their handshakes bounded, as
        # the HTTP ports' are: a client that opens them and says nothing would hold descriptors without end.
        port_options = [("grpc.so_reuseport", 0),
                        ("grpc.max_allowed_incoming_connections", config.max_grpc_connections),
                        ("grpc.server_handshake_timeout_ms", round(config.grpc_handshake_timeout_seconds * 1000))]
        self._server = grpc.aio.server(interceptors=interceptors, options=[
            *port_options,
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", -1),
        ])
        tts_pb2_grpc.add_TextToSpeechServicer_to_server(self.service, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            self._server)

        def listen(server: grpc.aio.Server, flag: str, port: int,
                   credentials: grpc.ServerCredentials | None = None) -> int:
            address = f"{config.host}:{port}"
            try:
                if credentials is None:
                    return server.add_insecure_port(address)
                return server.add_secure_port(address, credentials)
            except RuntimeError:  # gRPC says only that binding failed; its own log line just before says why
                raise OSError(f"{flag} {port}: cannot listen on {address}: the port is already in use, or the "
                              f"host is not an address of this machine") from None

        self.port = listen(self._server, "--port", config.port, server_credentials(config))
        # The kubelet's gRPC probes speak plaintext only: a TLS server can offer them health alone.
        self._health_server: grpc.aio.Server | None = None
        # Ends by itself once the engine has (its stop included).
        self._cores_follower: asyncio.Task[None] | None = None
        self.health_port: int | None = None
        if config.health_port is not None:
            self._health_server = grpc.aio.server(interceptors=[RequestParsingInterceptor()], options=port_options)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
            self.health_port = listen(self._health_server, "--health-port", config.health_port)
        # /metrics is served on this event loop: an idle connection costs a coroutine, not a thread, and the
        # gauges that read the engine are read on the engine's thread.
        self._metrics_http: web.AppRunner | None = None
        if config.metrics_port is not None:

            async def scrape(request: web.Request) -> web.Response:
                metrics = self.steps.metrics
                if metrics is None:  # its series carry the model's name, and the model is still loading
                    return web.Response(status=503, text="no metrics yet: the model is still loading\n")
                render, content_type = choose_encoder(request.headers.get("Accept", ""))
                return web.Response(body=render(metrics.registry), headers={"Content-Type": content_type})

            app = web.Application()
            app.router.add_get("/metrics", scrape)
            self._metrics_http = http_runner(app, config)
        # The OpenAI-compatible API, on this loop as well, on the same speech steps. A client that disconnects
        # cancels its handler, which aborts its request in the engine; after a drain, what is left gets the same
        # short grace as gRPC's calls.
        self._openai_http: web.AppRunner | None = None
        if config.http_port is not None:
            app = OpenAISpeechApi(self.steps, self.state, config).app()
            WebSocketDoor(self.steps, self.state, config).add_routes(app)  # streamed text over WebSockets
            self._openai_http = http_runner(app, config, handler_cancellation=True, shutdown_timeout=_FLUSH_GRACE_S)
        self._http_listeners: list[asyncio.Server] = []

    async def start(self) -> None:
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._metrics_http is not None:
            await self._listen_http(self._metrics_http, "--metrics-port", self.config.metrics_port)
            logger.info("metrics on http://%s:%d/metrics", self.config.host, self.config.metrics_port)
        if self._openai_http is not None:
            try:
                await self._listen_http(self._openai_http, "--http-port", self.config.http_port, http_tls(self.config))
            except OSError:
                await self._stop_http()
                raise
            logger.info("OpenAI-compatible API on %s://%s:%d/v1", "https" if self.config.uses_tls else "http",
                        self.config.host, self.config.http_port)
        await self._server.start()
        if self._health_server is not None:
            await self._health_server.start()
        logger.info("listening on %s:%d (%s)", self.config.host, self.port, "TLS" if self.config.uses_tls else
                    "plaintext")

    async def _listen_http(self, runner: web.AppRunner, flag: str, port: int | None,
                           tls: ssl.SSLContext | None = None) -> None:
        """Serve `runner`'s application on `port`, each connection through a ConnectionGuard (in place of aiohttp's
        TCPSite, which has no hook between accepting a connection and serving it)."""
        await runner.setup()
        assert runner.server is not None
        config = self.config
        limits = ConnectionLimits(config.max_http_connections, config.max_http_connections_per_address,
                                  config.http_header_timeout_seconds)
        # "::" binds IPv6 alone; no host binds every interface of both families, as gRPC's [::] does.
        host = None if config.bare_host == "::" else config.bare_host
        try:
            guard = ConnectionGuard(runner.server, limits, http_handler_options(config), tls)
            listener = await asyncio.get_running_loop().create_server(guard, host, port)
        except OSError as error:
            await runner.cleanup()
            reason = os.strerror(error.errno) if error.errno else str(error)
            raise OSError(f"{flag} {port}: cannot listen on {config.host}:{port}: {reason}") from None
        self._http_listeners.append(listener)
        bound_http_logs()

    async def _stop_http(self) -> None:
        """Stop accepting on the HTTP ports, then close their connections (a request in progress within its grace)."""
        for listener in self._http_listeners:
            listener.close()
        self._http_listeners.clear()
        for runner in (self._openai_http, self._metrics_http):
            if runner is not None and runner.server is not None:
                await runner.cleanup()

    async def serve(self, engine: EngineDoor, metrics: ServiceMetrics | None = None,
                    tracer: CallTracer | None = None) -> None:
        """Start answering speech calls with `engine`, which must be running; record into `metrics` and trace with
        `tracer` when given."""
        if metrics is not None:
            watch_engine(metrics, engine)
            self.steps.metrics = metrics
        self.steps.tracer = tracer
        self.steps.engine = engine
        self.state.is_ready = True
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        self._cores_follower = asyncio.create_task(self._follow_cores(engine), name="tts-health-follows-cores")
        if engine.model_info.is_random:
            logger.warning("serving %s: RANDOM weights, as --model asked; every call gets noise, not speech",
                           engine.model_info.source)
        else:
            logger.info("serving %s", engine.model_info.source)

    async def _follow_cores(self, engine: EngineDoor) -> None:
        """Health says NOT_SERVING while no engine core runs (with several, every one starting again at once), and
        SERVING again once one does. A drain's NOT_SERVING stays: the health service ignores changes after it."""
        num_running = engine.num_cores_running
        while await engine.wait_cores_changed(num_running):
            num_running = engine.num_cores_running
            await self._set_health(health_pb2.HealthCheckResponse.SERVING if num_running else
                                   health_pb2.HealthCheckResponse.NOT_SERVING)
            if not num_running:
                logger.error("not serving while every engine core starts again")

    async def stop_serving(self) -> None:
        """The engine has gone: health says NOT_SERVING and new speech calls are refused (UNAVAILABLE)."""
        self.state.is_ready = False
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        logger.error("not serving: the engine has stopped")

    async def drain(self) -> bool:
        """Refuse new calls and let running ones finish within the drain timeout; True when all did."""
        self.state.start_draining()
        await self.health.enter_graceful_shutdown()
        logger.info("draining: waiting up to %g s for %d call(s)", self.config.drain_timeout_seconds,
                    self.calls.num_active)
        is_idle = await self.calls.wait_idle(self.config.drain_timeout_seconds)
        if not is_idle:
            logger.warning("drain timeout: cancelling %d call(s)", self.calls.num_active)
        return is_idle

    async def shutdown(self) -> None:
        """Drain, stop listening (cancelling what is left), then stop the engine."""
        is_idle = await self.drain()
        # A handler that has ended may still have messages in gRPC's buffers on their way to a slow reader: a
        # short grace lets them arrive (stop returns as soon as every call is done). After a drain that ran
        # out of time, what is left is cancelled at once.
        await self._server.stop(grace=_FLUSH_GRACE_S if is_idle else None)
        if self._health_server is not None:
            await self._health_server.stop(grace=None)
        await self._stop_http()
        engine = self.steps.engine
        if engine is not None:
            await engine.stop()
        self.steps.close()
        logger.info("stopped")

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()

    async def _set_health(self, status: int) -> None:
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)
