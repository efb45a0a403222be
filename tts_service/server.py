"""The gRPC server: the public API (proto/qwen3_tts/v1/tts.proto) translated to and from the engine.

The servicer only translates: requests become SynthesisRequests, engine errors become status
codes, audio chunks become encoded bytes. The engine owns scheduling. Around the servicer sit
the standard gRPC health service (NOT_SERVING until the engine runs, and again while draining),
server reflection (so grpcurl needs no .proto), an API-key check and an admission check that
answers UNAVAILABLE while the server is starting or draining.

Every engine call happens on the event loop's thread, as the engine requires: gRPC's asyncio
server runs every handler there. Voice cloning (audio decoding, the speaker and codec encoders)
runs in a worker thread so that the loop keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

from clients.qwen3_tts_client.protocol import SERVICE_NAME, tts_pb2, tts_pb2_grpc
from scheduler.request import FinishReason
from scheduler.scheduler import QueueFullError, RequestTooLargeError
from tts_service.audio import (
    MODEL_SAMPLE_RATE,
    OPUS_SAMPLE_RATES,
    SUPPORTED_SAMPLE_RATES,
    AudioEncoding,
    AudioFormatError,
    OutputFormat,
    StreamEncoder,
    encode_whole,
)
from tts_service.audio_input import AudioLimits, ReferenceAudioError, decode_audio_file, decode_pcm16
from tts_service.config import ServerConfig
from tts_service.engine import Engine, EngineStoppedError, SchedulingPolicy
from tts_service.generate import GenerationParams
from tts_service.model.checkpoint import LoadedModel
from tts_service.prompts import PromptError, SynthesisInput, VoiceClone
from tts_service.runner import RunnerConfig
from tts_service.sampling import SamplingParams
from tts_service.streams import RequestFailed, RequestStream, SynthesisRequest, SynthesisSummary
from tts_service.synthesize import EagerSynthesizer

logger = logging.getLogger(__name__)

pb: Any = tts_pb2
REQUEST_ID_HEADER = "x-request-id"
# How long a client refused for a full queue should wait: about one short utterance's generation.
QUEUE_FULL_RETRY_DELAY_S = 1.0
# Prompt positions beyond the generated frames: chat template, codec tags, speaker slot.
_PROMPT_OVERHEAD_POSITIONS = 64
_HEALTH_SERVICE_PREFIX = "/grpc.health.v1.Health/"
_TTS_METHOD_PREFIX = f"/{SERVICE_NAME}/"

# Proto values are AUDIO_ENCODING_<name of the AudioEncoding member>.
_ENCODINGS = {pb.AudioEncoding.Value(f"AUDIO_ENCODING_{encoding.name}"): encoding for encoding in AudioEncoding}
_ENCODING_NUMBERS = {encoding: number for number, encoding in _ENCODINGS.items()}
_FINISH_REASONS = {
    FinishReason.STOPPED: pb.FINISH_REASON_STOPPED, FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.ABORTED: pb.FINISH_REASON_ABORTED,
}
# The engine names voice fields bare; the API nests them in `voice`.
_PROMPT_FIELDS = {"speaker": "voice.speaker", "language": "voice.language", "instruction": "voice.instruction"}
_MODEL_MODES = {
    "custom_voice": pb.MODEL_MODE_CUSTOM_VOICE, "voice_design": pb.MODEL_MODE_VOICE_DESIGN,
    "base": pb.MODEL_MODE_VOICE_CLONE,
}


# -- the engine, sized from the configuration ----------------------------------------------------


def runner_config(config: ServerConfig, frame_rate_hz: float) -> RunnerConfig:
    """Room for the longest request the limits allow: instruction and text, reference frames, audio frames."""
    max_positions = (math.ceil(config.max_audio_seconds * frame_rate_hz)
                     + math.ceil(config.max_reference_audio_seconds * frame_rate_hz)
                     + 2 * config.max_text_chars + _PROMPT_OVERHEAD_POSITIONS)
    return RunnerConfig(max_num_slots=config.max_concurrent, num_kv_blocks=config.kv_blocks,
                        max_positions_per_request=max_positions)


def scheduling_policy(config: ServerConfig) -> SchedulingPolicy:
    return SchedulingPolicy(max_running=config.max_concurrent, max_waiting=config.max_waiting)


def create_engine(model: LoadedModel, config: ServerConfig) -> Engine:
    """The engine for `model` under the configured limits (not started)."""
    return Engine.create(model, runner_config(config, model.speech_config.frame_rate_hz), scheduling_policy(config))


@dataclass(frozen=True)
class Runtime:
    """What the service needs once the model is loaded and the engine runs."""

    model: LoadedModel
    engine: Engine
    cloner: EagerSynthesizer

    @classmethod
    def for_engine(cls, model: LoadedModel, engine: Engine) -> Runtime:
        return cls(model, engine, EagerSynthesizer(model))


# -- errors as statuses ---------------------------------------------------------------------------


class ApiError(Exception):
    """A status to end a call with."""

    def __init__(self, code: grpc.StatusCode, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s


def invalid(field: str, message: str) -> ApiError:
    return ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {message}")


def api_error_for(error: Exception) -> ApiError | None:
    """The status an engine or input error becomes; None for an unexpected error."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, PromptError):
        field = _PROMPT_FIELDS.get(error.field, error.field)
        return invalid(field, str(error).removeprefix(f"{error.field}: "))
    if isinstance(error, AudioFormatError):
        return ApiError(grpc.StatusCode.INVALID_ARGUMENT, str(error))
    if isinstance(error, ReferenceAudioError):
        return invalid("voice.reference_audio", str(error))
    if isinstance(error, QueueFullError):
        return ApiError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the server is busy ({error}); retry later",
                        retry_after_s=QUEUE_FULL_RETRY_DELAY_S)
    if isinstance(error, RequestTooLargeError):
        return ApiError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                        "the request needs more memory than the server has; ask for less audio "
                        "(generation.max_audio_seconds) or send a shorter text or reference")
    if isinstance(error, EngineStoppedError):
        return ApiError(grpc.StatusCode.UNAVAILABLE, "the server is shutting down; retry")
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


@contextlib.asynccontextmanager
async def answering_errors(context: grpc.aio.ServicerContext, request_id: str) -> AsyncIterator[None]:
    """Ends the call with the status a known error maps to; anything else is INTERNAL, and logged."""
    try:
        yield
    except grpc.aio.AbortError:
        raise
    except Exception as error:  # every failure of one call ends that call only
        api_error = api_error_for(error)
        if api_error is None:
            logger.exception("request %s failed", request_id)
            api_error = ApiError(grpc.StatusCode.INTERNAL, "the request failed inside the server")
        elif api_error.code is grpc.StatusCode.INTERNAL:
            logger.error("request %s failed: %s", request_id, error)
        await abort_with(context, api_error)


# -- requests into engine terms -------------------------------------------------------------------


def output_format(message: Any) -> OutputFormat:
    encoding = AudioEncoding.WAV if message.encoding == pb.AUDIO_ENCODING_UNSPECIFIED else _ENCODINGS.get(
        message.encoding, message.encoding)
    return OutputFormat(encoding, message.sample_rate or MODEL_SAMPLE_RATE)


def generation_params(message: Any, config: ServerConfig, frame_rate_hz: float) -> GenerationParams:
    """GenerationConfig -> GenerationParams; unset fields keep the model's defaults."""
    defaults = GenerationParams()
    sampling = defaults.talker
    max_seconds = message.max_audio_seconds if message.HasField("max_audio_seconds") else config.max_audio_seconds
    if not 0 < max_seconds <= config.max_audio_seconds:
        raise invalid("generation.max_audio_seconds",
                      f"must be in (0, {config.max_audio_seconds:g}], got {max_seconds}")
    try:
        sampling = SamplingParams(
            temperature=message.temperature if message.HasField("temperature") else sampling.temperature,
            top_k=message.top_k if message.HasField("top_k") else sampling.top_k,
            top_p=message.top_p if message.HasField("top_p") else sampling.top_p)
        return GenerationParams(
            talker=sampling, predictor=sampling,
            repetition_penalty=(message.repetition_penalty if message.HasField("repetition_penalty")
                                else defaults.repetition_penalty),
            max_new_frames=max(1, round(max_seconds * frame_rate_hz)),
            seed=message.seed if message.HasField("seed") else defaults.seed)
    except ValueError as error:  # their messages start with the parameter's name
        raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"generation.{error}") from None


def check_text_length(text: str, field: str, config: ServerConfig) -> None:
    if len(text) > config.max_text_chars:
        raise invalid(field, f"is {len(text)} characters long; at most {config.max_text_chars} are accepted")


def synthesis_input(text: str, voice: Any, clone: VoiceClone | None, non_streaming_text: bool) -> SynthesisInput:
    return SynthesisInput(text=text, language=voice.language or "auto", speaker=voice.speaker or None,
                          instruction=voice.instruction or None, clone=clone, non_streaming_mode=non_streaming_text)


def check_clone_request(voice: Any, model: LoadedModel) -> None:
    """Refuse a clone the model cannot do before spending time on the reference audio."""
    if model.config.model_type != "base":
        raise PromptError("voice.reference_audio", f"the loaded {model.config.model_type} model cannot clone "
                                                   "voices; voice cloning needs a Base checkpoint")
    if not voice.x_vector_only and not voice.reference_text.strip():
        raise PromptError("voice.reference_text", "in-context cloning needs the transcript of the reference "
                                                  "audio (or set x_vector_only)")


def decode_reference(voice: Any, limits: AudioLimits) -> np.ndarray:
    if voice.reference_audio_pcm16_rate:
        return decode_pcm16(voice.reference_audio, voice.reference_audio_pcm16_rate, limits=limits)
    return decode_audio_file(voice.reference_audio, limits)


# -- responses out of engine terms ----------------------------------------------------------------


def output_formats() -> list[Any]:
    """Every encoding with the rates it can be produced at, and its MIME type without the rate."""
    formats = []
    for encoding in AudioEncoding:
        rates = [rate for rate in SUPPORTED_SAMPLE_RATES
                 if encoding is not AudioEncoding.OGG_OPUS or rate in OPUS_SAMPLE_RATES]
        mime_type = OutputFormat(encoding, MODEL_SAMPLE_RATE).mime_type.split(";rate=")[0]
        formats.append(pb.EncodingSupport(encoding=_ENCODING_NUMBERS[encoding], sample_rates=rates,
                                          mime_type=mime_type))
    return formats


def completion(summary: SynthesisSummary, samples_per_frame: int, native_rate: int) -> Any:
    usage = pb.Usage(audio_seconds=summary.num_frames * samples_per_frame / native_rate,
                     audio_frames=summary.num_frames, input_tokens=summary.num_text_tokens,
                     queue_seconds=summary.queue_time_s or 0.0,
                     time_to_first_audio_seconds=summary.time_to_first_audio_s or 0.0)
    return pb.Completion(finish_reason=_FINISH_REASONS.get(summary.finish_reason, pb.FINISH_REASON_UNSPECIFIED),
                         usage=usage, request_id=summary.request_id)


class ChunkEncoder:
    """Engine audio -> AudioChunk messages, with each chunk's span in samples at the output rate."""

    def __init__(self, output: OutputFormat) -> None:
        self._encoder = StreamEncoder(output)
        self._sample_rate = output.sample_rate
        self._num_sent_samples = 0
        # Resampling and Opus cost real CPU time, which must not stall the event loop.
        self.needs_thread = output.sample_rate != MODEL_SAMPLE_RATE or output.encoding is AudioEncoding.OGG_OPUS

    def encode(self, samples: np.ndarray) -> Any | None:
        """The chunk to send, or None while the encoder holds everything back."""
        data = self._encoder.encode(samples)
        return self._chunk(data) if data else None

    def finish(self) -> Any | None:
        data = self._encoder.finish()
        return self._chunk(data) if data or self._encoder.num_output_samples > self._num_sent_samples else None

    def _chunk(self, data: bytes) -> Any:
        start, end = self._num_sent_samples, self._encoder.num_output_samples
        self._num_sent_samples = end
        rate = self._sample_rate
        return pb.AudioChunk(audio=data, offset_samples=start, num_samples=end - start,
                             offset_seconds=start / rate, duration_seconds=(end - start) / rate)


async def run_encoder(encoder: ChunkEncoder, step: Callable[[], Any]) -> Any:
    return await asyncio.to_thread(step) if encoder.needs_thread else step()


# -- the servicer ---------------------------------------------------------------------------------


class CallTracker:
    """Counts the calls in progress, so that draining can wait for them."""

    def __init__(self) -> None:
        self.num_active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.asynccontextmanager
    async def track(self) -> AsyncIterator[None]:
        self.num_active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.num_active -= 1
            if self.num_active == 0:
                self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        return self.num_active == 0


@dataclass(frozen=True)
class PreparedRequest:
    request_id: str
    synthesis: SynthesisInput
    params: GenerationParams
    output: OutputFormat


class TextToSpeechService(tts_pb2_grpc.TextToSpeechServicer):
    def __init__(self, config: ServerConfig, calls: CallTracker) -> None:
        self.config = config
        self.calls = calls
        self.runtime: Runtime | None = None
        self._reference_limits = AudioLimits(max_seconds=config.max_reference_audio_seconds)
        # One cloning at a time: the encoders are heavy and share the device with the engine.
        self._clone_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tts-voice-clone")

    def close(self) -> None:
        self._clone_executor.shutdown(wait=False, cancel_futures=True)

    def _runtime(self) -> Runtime:
        if self.runtime is None:
            raise ApiError(grpc.StatusCode.UNAVAILABLE, "the server is still loading its model; retry")
        return self.runtime

    # ListVoices

    async def ListVoices(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async with answering_errors(context, "-"):
            return self._voices(self._runtime().model)

    def _voices(self, model: LoadedModel) -> Any:
        talker = model.config.talker
        speakers = [pb.Speaker(name=name, dialect=talker.speaker_dialects.get(name) or "")
                    for name in sorted(talker.speaker_ids)]
        config = self.config
        limits = pb.Limits(max_text_chars=config.max_text_chars, max_audio_seconds=config.max_audio_seconds,
                           max_reference_audio_seconds=config.max_reference_audio_seconds,
                           max_message_bytes=config.max_message_bytes,
                           stream_idle_timeout_seconds=config.stream_idle_timeout_seconds,
                           max_stream_seconds=config.max_stream_seconds)
        return pb.ListVoicesResponse(
            model=model.source, mode=_MODEL_MODES.get(model.config.model_type, pb.MODEL_MODE_UNSPECIFIED),
            model_size=model.config.model_size, speakers=speakers, languages=list(talker.languages),
            accepts_instruction=model.config.accepts_instruction,
            supports_in_context_clone=model.codec_encoder is not None, random_weights=model.is_random,
            native_sample_rate=model.speech_config.output_sample_rate, output_formats=output_formats(),
            limits=limits)

    # Synthesize

    async def Synthesize(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        request_id = uuid.uuid4().hex
        async with self.calls.track(), answering_errors(context, request_id):
            await context.send_initial_metadata(((REQUEST_ID_HEADER, request_id),))
            runtime = self._runtime()
            prepared = await self._prepare(request_id, request.text, request.voice, request.generation,
                                           request.audio_format)
            stream = self._submit(runtime, prepared, context, is_text_open=False)
            try:
                waveform, summary = await stream.collect()
            finally:
                runtime.engine.abort(request_id)
            audio = await asyncio.to_thread(encode_whole, waveform, prepared.output)
            self._log_done(summary)
            return pb.SynthesizeResponse(
                audio=audio, mime_type=prepared.output.mime_type, completion=self._completion(summary),
                audio_format=pb.AudioFormat(encoding=_ENCODING_NUMBERS[prepared.output.encoding],
                                            sample_rate=prepared.output.sample_rate))

    # SynthesizeOnline

    async def SynthesizeOnline(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        request_id = uuid.uuid4().hex
        async with self.calls.track(), answering_errors(context, request_id):
            await context.send_initial_metadata(((REQUEST_ID_HEADER, request_id),))
            runtime = self._runtime()
            prepared = await self._prepare(request_id, request.text, request.voice, request.generation,
                                           request.audio_format)
            stream = self._submit(runtime, prepared, context, is_text_open=False)
            try:
                async for message in self._audio_messages(stream, prepared.output, pb.SynthesizeOnlineResponse):
                    yield message
            finally:
                runtime.engine.abort(request_id)

    async def _audio_messages(self, stream: RequestStream, output: OutputFormat,
                              message_type: Any) -> AsyncIterator[Any]:
        """The stream's audio as response messages; the last one carries the completion."""
        encoder = ChunkEncoder(output)
        async for piece in stream:
            chunk = await run_encoder(encoder, lambda piece=piece: encoder.encode(piece.samples))
            if chunk is not None:
                yield message_type(chunk=chunk)
        summary = stream.summary
        assert summary is not None
        last = message_type(completion=self._completion(summary))
        chunk = await run_encoder(encoder, encoder.finish)
        if chunk is not None:
            last.chunk.CopyFrom(chunk)
        self._log_done(summary)
        yield last

    # StreamingSynthesize

    async def StreamingSynthesize(self, request_iterator: AsyncIterator[Any],
                                  context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        request_id = uuid.uuid4().hex
        async with self.calls.track(), answering_errors(context, request_id):
            await context.send_initial_metadata(((REQUEST_ID_HEADER, request_id),))
            runtime = self._runtime()
            started = time.monotonic()
            config = await self._first_config(request_iterator)
            prepared = await self._prepare(request_id, "", config.voice, config.generation, config.audio_format)
            stream = self._submit(runtime, prepared, context, is_text_open=True,
                                  max_seconds=self.config.max_stream_seconds)
            outbox: asyncio.Queue[Any] = asyncio.Queue()
            reader = asyncio.create_task(self._read_text(request_iterator, runtime.engine, request_id, outbox,
                                                         started))
            try:
                async for message in self._merged(stream, prepared.output, outbox):
                    yield message
            finally:
                reader.cancel()
                runtime.engine.abort(request_id)

    async def _first_config(self, request_iterator: AsyncIterator[Any]) -> Any:
        try:
            first = await asyncio.wait_for(anext(request_iterator), self.config.stream_idle_timeout_seconds)
        except StopAsyncIteration:
            raise invalid("config", "the request stream ended before its first message, the config") from None
        except TimeoutError:
            raise self._idle_error() from None
        if first.WhichOneof("request") != "config":
            raise invalid("config", "the first message must carry the config (voice, audio format, generation), "
                                    "and only the config")
        return first.config

    async def _read_text(self, request_iterator: AsyncIterator[Any], engine: Engine, request_id: str,
                         outbox: asyncio.Queue[Any], started: float) -> None:
        """Request messages -> the engine's open text, until half-close; a protocol error ends the call."""
        num_chars = 0
        try:
            while True:
                remaining_s = self.config.max_stream_seconds - (time.monotonic() - started)
                if remaining_s <= 0:
                    raise self._stream_too_long_error()
                timeout = min(self.config.stream_idle_timeout_seconds, remaining_s)
                try:
                    message = await asyncio.wait_for(anext(request_iterator), timeout)
                except StopAsyncIteration:
                    engine.close_text(request_id)
                    return
                except TimeoutError:
                    raise (self._idle_error() if timeout < remaining_s else self._stream_too_long_error()) from None
                kind = message.WhichOneof("request")
                if kind == "text":
                    num_chars += len(message.text)
                    if num_chars > self.config.max_text_chars:
                        raise invalid("text", f"the streamed text exceeds {self.config.max_text_chars} characters")
                    engine.append_text(request_id, message.text)
                elif kind == "flush":
                    outbox.put_nowait(pb.StreamingSynthesizeResponse(flush_ack=pb.FlushAck(marker=message.flush.marker)))
                elif kind == "config":
                    raise invalid("config", "only the first message may carry the config")
                else:
                    raise invalid("request", "every message after the config carries text or a flush")
        except Exception as error:  # ends the call: the writer raises what it finds in the outbox
            outbox.put_nowait(error)
            engine.abort(request_id)

    async def _merged(self, stream: RequestStream, output: OutputFormat,
                      outbox: asyncio.Queue[Any]) -> AsyncIterator[Any]:
        """Audio messages and flush acks in the order they arose; an error from the reader ends the call."""
        pump = asyncio.create_task(self._pump(stream, output, outbox))
        try:
            while True:
                item = await outbox.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.HasField("completion"):
                    return
        finally:
            pump.cancel()

    async def _pump(self, stream: RequestStream, output: OutputFormat, outbox: asyncio.Queue[Any]) -> None:
        try:
            async for message in self._audio_messages(stream, output, pb.StreamingSynthesizeResponse):
                if message.HasField("completion") and message.completion.finish_reason == pb.FINISH_REASON_ABORTED:
                    # Not the client (it would be gone) nor a protocol error (reported first): the time limit.
                    raise self._stream_too_long_error()
                outbox.put_nowait(message)
        except Exception as error:
            outbox.put_nowait(error)

    def _idle_error(self) -> ApiError:
        return ApiError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no text arrived for "
                        f"{self.config.stream_idle_timeout_seconds:g} s; send text more often or close the stream")

    def _stream_too_long_error(self) -> ApiError:
        return ApiError(grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"the stream ran past the server's limit of {self.config.max_stream_seconds:g} s")

    # Shared steps

    async def _prepare(self, request_id: str, text: str, voice: Any, generation: Any,
                       audio_format: Any) -> PreparedRequest:
        """Check the request (the engine checks the voice at submit) and clone its voice, if any."""
        runtime = self._runtime()
        model = runtime.model
        output = output_format(audio_format)
        params = generation_params(generation, self.config, model.speech_config.frame_rate_hz)
        check_text_length(text, "text", self.config)
        check_text_length(voice.instruction, "voice.instruction", self.config)
        clone = await self._clone(runtime, voice) if voice.reference_audio else None
        return PreparedRequest(request_id, synthesis_input(text, voice, clone, generation.non_streaming_text),
                               params, output)

    async def _clone(self, runtime: Runtime, voice: Any) -> VoiceClone:
        check_clone_request(voice, runtime.model)

        def clone() -> VoiceClone:
            wav = decode_reference(voice, self._reference_limits)
            return runtime.cloner.clone_voice(wav, voice.reference_text or None, voice.x_vector_only)

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._clone_executor, clone)

    def _submit(self, runtime: Runtime, prepared: PreparedRequest, context: grpc.aio.ServicerContext,
                is_text_open: bool, max_seconds: float | None = None) -> RequestStream:
        """Queue the request; its engine deadline is the call's deadline (or the stream's limit), if any."""
        engine = runtime.engine
        limits = [seconds for seconds in (context.time_remaining(), max_seconds) if seconds is not None]
        deadline = engine.clock() + min(limits) if limits else None
        return engine.submit(SynthesisRequest(prepared.request_id, prepared.synthesis, prepared.params,
                                              is_text_open=is_text_open, deadline=deadline))

    def _completion(self, summary: SynthesisSummary) -> Any:
        speech = self._runtime().model.speech_config
        return completion(summary, speech.samples_per_frame, speech.output_sample_rate)

    @staticmethod
    def _log_done(summary: SynthesisSummary) -> None:
        logger.info("request %s: %s after %d frames (%d text tokens), queued %.3f s, first audio %s",
                    summary.request_id, summary.finish_reason.value, summary.num_frames, summary.num_text_tokens,
                    summary.queue_time_s or 0.0, "-" if summary.time_to_first_audio_s is None
                    else f"{summary.time_to_first_audio_s:.3f} s")


# -- interceptors ---------------------------------------------------------------------------------


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


# -- the server -----------------------------------------------------------------------------------


def server_credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    if config.tls_cert is None or config.tls_key is None:
        return None
    client_ca = config.tls_client_ca.read_bytes() if config.tls_client_ca is not None else None
    return grpc.ssl_server_credentials([(config.tls_key.read_bytes(), config.tls_cert.read_bytes())],
                                       root_certificates=client_ca, require_client_auth=client_ca is not None)


class TtsServer:
    """The listening server: start() it, serve() a runtime once the engine runs, shutdown() to drain and stop.

    Create it inside a running event loop.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.state = ServingState()
        self.calls = CallTracker()
        self.health = health.aio.HealthServicer()
        self.service = TextToSpeechService(config, self.calls)
        interceptors: list[grpc.aio.ServerInterceptor] = [AdmissionInterceptor(self.state)]
        if config.api_keys:
            interceptors.insert(0, ApiKeyInterceptor(config.api_keys))
        self._server = grpc.aio.server(interceptors=interceptors, options=[
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", -1),
        ])
        tts_pb2_grpc.add_TextToSpeechServicer_to_server(self.service, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            self._server)
        credentials = server_credentials(config)
        if credentials is None:
            self.port = self._server.add_insecure_port(config.address)
        else:
            self.port = self._server.add_secure_port(config.address, credentials)

    async def start(self) -> None:
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._server.start()
        logger.info("listening on %s:%d (%s)", self.config.host, self.port, "TLS" if self.config.uses_tls else
                    "plaintext")

    async def serve(self, runtime: Runtime) -> None:
        """Start answering speech calls with `runtime`, whose engine must be running."""
        self.service.runtime = runtime
        self.state.is_ready = True
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        logger.info("serving %s", runtime.model.source)

    async def drain(self) -> bool:
        """Refuse new calls and let running ones finish within the drain timeout; True when all did."""
        self.state.is_draining = True
        await self.health.enter_graceful_shutdown()
        logger.info("draining: waiting up to %g s for %d call(s)", self.config.drain_timeout_seconds,
                    self.calls.num_active)
        is_idle = await self.calls.wait_idle(self.config.drain_timeout_seconds)
        if not is_idle:
            logger.warning("drain timeout: cancelling %d call(s)", self.calls.num_active)
        return is_idle

    async def shutdown(self) -> None:
        """Drain, stop listening (cancelling what is left), then stop the engine."""
        await self.drain()
        await self._server.stop(grace=None)
        runtime = self.service.runtime
        if runtime is not None:
            await runtime.engine.stop()
        self.service.close()
        logger.info("stopped")

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()

    async def _set_health(self, status: int) -> None:
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)
