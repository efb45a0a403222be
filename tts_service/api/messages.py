"""Requests into engine terms and responses out of them: formats, generation settings, voices, usage."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import grpc
import numpy as np

from qwen3_tts.v1.protocol import tts_pb2
from tts_service.api.config import InputLimits, ServerConfig
from tts_service.api.errors import ApiError, invalid
from tts_service.api.lexicons import Lexicon, LexiconEntry
from tts_service.api.word_timestamps import TimedWord
from tts_service.audio.output import (
    MODEL_SAMPLE_RATE,
    OPUS_SAMPLE_RATES,
    SUPPORTED_SAMPLE_RATES,
    AudioEncoding,
    OutputFormat,
    StreamEncoder,
)
from tts_service.audio.reference import AudioLimits, decode_audio_file, decode_pcm16
from tts_service.engine import (
    FinishReason,
    GenerationParams,
    ModelInfo,
    PromptError,
    SamplingParams,
    SynthesisInput,
    SynthesisSummary,
    VoiceClone,
)

pb: Any = tts_pb2
# Proto values are AUDIO_ENCODING_<name of the AudioEncoding member>.
ENCODINGS = {pb.AudioEncoding.Value(f"AUDIO_ENCODING_{encoding.name}"): encoding for encoding in AudioEncoding}
ENCODING_NUMBERS = {encoding: number for number, encoding in ENCODINGS.items()}
_FINISH_REASONS = {
    FinishReason.STOPPED: pb.FINISH_REASON_STOPPED, FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.ABORTED: pb.FINISH_REASON_ABORTED,
}


# -- requests into engine terms -------------------------------------------------------------------


def output_format(message: Any) -> OutputFormat:
    encoding = AudioEncoding.WAV if message.encoding == pb.AUDIO_ENCODING_UNSPECIFIED else ENCODINGS.get(
        message.encoding, message.encoding)
    return OutputFormat(encoding, message.sample_rate or MODEL_SAMPLE_RATE, message.bit_rate_kbps or None)


def generation_params(message: Any, config: ServerConfig, model: ModelInfo, text: str | None) -> GenerationParams:
    """GenerationConfig -> GenerationParams; unset fields keep the model's defaults (a set sampling field applies
    to both the talker and the code predictor), and an unset length the model's default for `text` (None: text
    still arriving)."""
    defaults = model.default_params
    engine = config.engine
    # A text spoken segment by segment may run to the document limit in all, and so may streamed text, which is
    # once it runs past a segment; the engine caps each segment.
    is_segmented = text is None or engine.is_segmented(text)
    ceiling = engine.max_document_audio_s if is_segmented else engine.max_audio_s
    max_seconds = (message.max_audio_seconds if message.HasField("max_audio_seconds")
                   else ceiling if is_segmented else model.default_audio_seconds(text, ceiling))
    if not 0 < max_seconds <= ceiling:
        raise invalid("generation.max_audio_seconds", f"must be in (0, {ceiling:g}], got {max_seconds}")
    def sampling(default: SamplingParams) -> SamplingParams:
        return SamplingParams(
            temperature=message.temperature if message.HasField("temperature") else default.temperature,
            top_k=message.top_k if message.HasField("top_k") else default.top_k,
            top_p=message.top_p if message.HasField("top_p") else default.top_p)

    try:
        return GenerationParams(
            talker=sampling(defaults.talker), predictor=sampling(defaults.predictor),
            repetition_penalty=(message.repetition_penalty if message.HasField("repetition_penalty")
                                else defaults.repetition_penalty),
            max_new_frames=max(1, round(max_seconds * model.frame_rate_hz)),
            seed=message.seed if message.HasField("seed") else defaults.seed)
    except ValueError as error:  # their messages start with the parameter's name
        raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"generation.{error}") from None


def check_input_limits(text: str, voice: Any, limits: InputLimits) -> None:
    """Refuse any field longer than its limit before any work is done with it."""
    for field, value, limit, unit in (
            ("text", text, limits.text_chars, "characters"),
            ("voice.instruction", voice.instruction, limits.instruction_chars, "characters"),
            ("voice.reference_text", voice.reference_text, limits.reference_text_chars, "characters"),
            ("voice.speaker", voice.speaker, limits.speaker_chars, "characters"),
            ("voice.language", voice.language, limits.language_chars, "characters"),
            ("voice.reference_audio", voice.reference_audio, limits.reference_audio_bytes, "bytes")):
        check_length(field, value, limit, unit)


def check_length(field: str, value: str | bytes, limit: int, unit: str = "characters") -> None:
    """Refuse a value longer than `limit`, naming the field and the limit; the value is never echoed."""
    if len(value) > limit:
        raise invalid(field, f"is {len(value)} {unit} long; at most {limit} are accepted")


def non_streaming_text(generation: Any, default: bool) -> bool:
    return generation.non_streaming_text if generation.HasField("non_streaming_text") else default


def synthesis_input(text: str, voice: Any, clone: VoiceClone | None, non_streaming_text: bool) -> SynthesisInput:
    return SynthesisInput(text=text, language=voice.language or "auto", speaker=voice.speaker or None,
                          instruction=voice.instruction or None, clone=clone, non_streaming_mode=non_streaming_text)


def check_clone_request(voice: Any, model: ModelInfo) -> None:
    """Refuse a clone the model cannot do before spending time on the reference audio."""
    if not model.can_clone:
        raise PromptError("voice.reference_audio", f"the loaded {model.model_type} model cannot clone "
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
        formats.append(pb.EncodingSupport(encoding=ENCODING_NUMBERS[encoding], sample_rates=rates,
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
        # Resampling, Opus and MP3 cost real CPU time, which must not stall the event loop.
        self.needs_thread = (output.sample_rate != MODEL_SAMPLE_RATE
                             or output.encoding in (AudioEncoding.OGG_OPUS, AudioEncoding.MP3))

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


def word_timings(words: Iterable[TimedWord]) -> list[Any]:
    """Timed words as WordTiming messages."""
    return [pb.WordTiming(word=word.word, start_char=word.start_char, end_char=word.end_char,
                          start_seconds=word.start_s, end_seconds=word.end_s) for word in words]


def lexicon_of(message: Any, where: str) -> Lexicon:
    """A Lexicon message as a checked Lexicon; errors name `where`.entries[i] and the field."""
    return Lexicon(tuple(LexiconEntry(entry.grapheme, entry.alias) for entry in message.entries), where=where)


def lexicon_message(lexicon: Lexicon) -> Any:
    return pb.Lexicon(entries=[pb.LexiconEntry(grapheme=entry.grapheme, alias=entry.alias)
                               for entry in lexicon.entries])
