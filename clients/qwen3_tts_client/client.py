"""Thin, typed wrappers over the generated stubs: a blocking client and an asyncio client.

Both return the API's own response messages (see proto/qwen3_tts/v1/tts.proto); the frozen
dataclasses here only make the requests short to write. Errors are grpc.RpcError (blocking) or
grpc.aio.AioRpcError (asyncio) with the server's status code and message.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from qwen3_tts.v1.protocol import tts_pb2, tts_pb2_grpc

pb: Any = tts_pb2
DEFAULT_TARGET = "localhost:50051"
# Synthesize returns the whole utterance in one message: gRPC's default 4 MB would cap it at ~90 s of 24 kHz WAV.
MAX_RECEIVE_MESSAGE_BYTES = 256 * 1024 * 1024
Metadata = Sequence[tuple[str, str]]


def _trace_context() -> Metadata:
    """The current OpenTelemetry context as `traceparent` metadata, so the server's span joins the caller's
    trace; nothing when OpenTelemetry is not installed or no span is active."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return ()
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items())


@dataclass(frozen=True)
class Voice:
    """Who speaks (see VoiceSelection in the .proto); empty fields take the server's defaults."""

    speaker: str = ""
    language: str = ""
    instruction: str = ""
    reference_audio: bytes = b""  # an audio file, or raw PCM16 when reference_audio_pcm16_rate is set
    reference_audio_pcm16_rate: int = 0
    reference_text: str = ""
    x_vector_only: bool = False
    voice_id: str = ""  # a registered voice (create_voice), instead of the reference fields

    def to_proto(self) -> Any:
        return pb.VoiceSelection(speaker=self.speaker, language=self.language, instruction=self.instruction,
                                 reference_audio=self.reference_audio,
                                 reference_audio_pcm16_rate=self.reference_audio_pcm16_rate,
                                 reference_text=self.reference_text, x_vector_only=self.x_vector_only,
                                 voice_id=self.voice_id)


@dataclass(frozen=True)
class VoiceReference:
    """The recording a registered voice is cloned from (see CreateVoiceRequest in the .proto)."""

    audio: bytes  # an audio file, or raw PCM16 when pcm16_rate is set
    text: str = ""  # its transcript: needed unless x_vector_only
    x_vector_only: bool = False
    pcm16_rate: int = 0

    def to_proto(self) -> Any:
        return pb.CreateVoiceRequest(reference_audio=self.audio, reference_audio_pcm16_rate=self.pcm16_rate,
                                     reference_text=self.text, x_vector_only=self.x_vector_only)


@dataclass(frozen=True)
class AudioFormat:
    """encoding: "pcm16", "wav", "ogg_opus", "mulaw", "alaw" or "mp3"; sample_rate 0 is the model's 24000 Hz;
    bit_rate_kbps (MP3 only) 0 is the server's default for the rate."""

    encoding: str = "wav"
    sample_rate: int = 0
    bit_rate_kbps: int = 0

    def to_proto(self) -> Any:
        return pb.AudioFormat(encoding=encoding_number(self.encoding), sample_rate=self.sample_rate,
                              bit_rate_kbps=self.bit_rate_kbps)


@dataclass(frozen=True)
class Generation:
    """Sampling settings; None keeps the model's default (see GenerationConfig in the .proto)."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    max_audio_seconds: float | None = None
    non_streaming_text: bool | None = None  # None: the server's default for the model and call

    def to_proto(self) -> Any:
        fields = {name: getattr(self, name) for name in ("temperature", "top_k", "top_p", "repetition_penalty",
                                                         "seed", "max_audio_seconds", "non_streaming_text")}
        return pb.GenerationConfig(**{name: value for name, value in fields.items() if value is not None})


_ENCODING_PREFIX = "AUDIO_ENCODING_"


def encoding_number(name: str) -> int:
    try:
        return pb.AudioEncoding.Value(_ENCODING_PREFIX + name.upper())
    except ValueError:
        names = ", ".join(value.name.removeprefix(_ENCODING_PREFIX).lower()
                          for value in pb.AudioEncoding.DESCRIPTOR.values if value.number)
        raise ValueError(f"unknown audio encoding {name!r}; use one of {names}") from None


def synthesize_request(text: str, voice: Voice | None = None, audio_format: AudioFormat | None = None,
                       generation: Generation | None = None, word_timestamps: bool = False) -> Any:
    return pb.SynthesizeRequest(text=text, voice=(voice or Voice()).to_proto(),
                                audio_format=(audio_format or AudioFormat()).to_proto(),
                                generation=(generation or Generation()).to_proto(), word_timestamps=word_timestamps)


def streaming_config(voice: Voice | None = None, audio_format: AudioFormat | None = None,
                     generation: Generation | None = None, utterance_id: str = "",
                     word_timestamps: bool = False) -> Any:
    config = pb.StreamingSynthesizeConfig(voice=(voice or Voice()).to_proto(),
                                          audio_format=(audio_format or AudioFormat()).to_proto(),
                                          generation=(generation or Generation()).to_proto(),
                                          utterance_id=utterance_id, word_timestamps=word_timestamps)
    return pb.StreamingSynthesizeRequest(config=config)


@dataclass(frozen=True)
class Flush:
    """Put among the text fragments of a streaming call to have the server answer with a FlushAck."""

    marker: str = ""
    utterance_id: str = ""


@dataclass(frozen=True)
class Say:
    """Text for one utterance of a streaming call; a new id opens a new utterance with the call's voice."""

    utterance_id: str
    text: str


@dataclass(frozen=True)
class CloseUtterance:
    """The utterance's text is complete: it is spoken to its end."""

    utterance_id: str


@dataclass(frozen=True)
class CancelUtterance:
    """Stop the utterance now (barge-in); the call and its other utterances go on."""

    utterance_id: str


StreamItem = str | Flush | Say | CloseUtterance | CancelUtterance


def fragment_request(fragment: StreamItem) -> Any:
    """A streaming call's request message for one item: a bare string is text for the call's first utterance."""
    if isinstance(fragment, str):
        return pb.StreamingSynthesizeRequest(text=fragment)
    if isinstance(fragment, Say):
        return pb.StreamingSynthesizeRequest(text=fragment.text, utterance_id=fragment.utterance_id)
    if isinstance(fragment, Flush):
        return pb.StreamingSynthesizeRequest(flush=pb.Flush(marker=fragment.marker),
                                             utterance_id=fragment.utterance_id)
    if isinstance(fragment, CloseUtterance):
        return pb.StreamingSynthesizeRequest(close_utterance=pb.CloseUtterance(), utterance_id=fragment.utterance_id)
    return pb.StreamingSynthesizeRequest(cancel_utterance=pb.CancelUtterance(), utterance_id=fragment.utterance_id)


@dataclass(frozen=True)
class Connection:
    """Where the server is and how to reach it."""

    target: str = DEFAULT_TARGET
    api_key: str | None = None
    tls: bool = False
    root_certificates: bytes | None = None  # PEM; None: the system's roots
    private_key: bytes | None = None  # PEM, with certificate_chain: a client certificate for mTLS
    certificate_chain: bytes | None = None

    @property
    def metadata(self) -> Metadata:
        """Sent with every call: the API key, and the caller's trace context when it has one."""
        key = (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()
        return (*key, *_trace_context())

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.root_certificates is not None or self.certificate_chain is not None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(self.root_certificates, self.private_key, self.certificate_chain)

    @property
    def options(self) -> list[tuple[str, int]]:
        return [("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_RECEIVE_MESSAGE_BYTES)]


class TtsClient:
    """Blocking client. Streaming calls return gRPC's call object: iterate it, or cancel() it."""

    def __init__(self, connection: Connection | None = None) -> None:
        self.connection = connection or Connection()
        c = self.connection
        self.channel = (grpc.secure_channel(c.target, c.credentials(), c.options) if c.uses_tls
                        else grpc.insecure_channel(c.target, c.options))
        self.stub = tts_pb2_grpc.TextToSpeechStub(self.channel)

    def __enter__(self) -> TtsClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def list_voices(self, timeout: float | None = None) -> Any:
        return self.stub.ListVoices(pb.ListVoicesRequest(), timeout=timeout, metadata=self.connection.metadata)

    def create_voice(self, reference: VoiceReference, timeout: float | None = None) -> Any:
        """Clone and store a voice; the RegisteredVoice's voice_id then goes in Voice(voice_id=...)."""
        return self.stub.CreateVoice(reference.to_proto(), timeout=timeout, metadata=self.connection.metadata)

    def get_voice(self, voice_id: str, timeout: float | None = None) -> Any:
        return self.stub.GetVoice(pb.GetVoiceRequest(voice_id=voice_id), timeout=timeout,
                                  metadata=self.connection.metadata)

    def delete_voice(self, voice_id: str, timeout: float | None = None) -> None:
        self.stub.DeleteVoice(pb.DeleteVoiceRequest(voice_id=voice_id), timeout=timeout,
                              metadata=self.connection.metadata)

    def synthesize(self, text: str, voice: Voice | None = None, audio_format: AudioFormat | None = None,
                   generation: Generation | None = None, timeout: float | None = None,
                   word_timestamps: bool = False) -> Any:
        """The SynthesizeResponse; with word_timestamps, its `words` time every word of the text."""
        return self.stub.Synthesize(synthesize_request(text, voice, audio_format, generation, word_timestamps),
                                    timeout=timeout, metadata=self.connection.metadata)

    def synthesize_online(self, text: str, voice: Voice | None = None, audio_format: AudioFormat | None = None,
                          generation: Generation | None = None, timeout: float | None = None,
                          word_timestamps: bool = False) -> Any:
        """An iterator of SynthesizeOnlineResponse that is also the call (cancel(), initial_metadata()).
        With word_timestamps, messages carrying `words` come among the audio, a sentence or so behind it."""
        return self.stub.SynthesizeOnline(synthesize_request(text, voice, audio_format, generation, word_timestamps),
                                          timeout=timeout, metadata=self.connection.metadata)

    def streaming_synthesize(self, fragments: Iterable[StreamItem], voice: Voice | None = None,
                             audio_format: AudioFormat | None = None, generation: Generation | None = None,
                             timeout: float | None = None, utterance_id: str = "",
                             word_timestamps: bool = False) -> Any:
        """Sends the config (opening the first utterance, `utterance_id`), then each item as `fragments` yields
        it (a blocking iterator is fine: gRPC reads it in its own thread), then half-closes. Returns the
        StreamingSynthesizeResponse iterator, which is also the call. word_timestamps asks for `words` in
        every utterance of the call."""

        def requests() -> Iterator[Any]:
            yield streaming_config(voice, audio_format, generation, utterance_id, word_timestamps)
            for fragment in fragments:
                yield fragment_request(fragment)

        return self.stub.StreamingSynthesize(requests(), timeout=timeout, metadata=self.connection.metadata)


class AsyncTtsClient:
    """asyncio client; create it inside a running event loop."""

    def __init__(self, connection: Connection | None = None) -> None:
        self.connection = connection or Connection()
        c = self.connection
        self.channel = (grpc.aio.secure_channel(c.target, c.credentials(), c.options) if c.uses_tls
                        else grpc.aio.insecure_channel(c.target, c.options))
        self.stub = tts_pb2_grpc.TextToSpeechStub(self.channel)

    async def __aenter__(self) -> AsyncTtsClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def list_voices(self, timeout: float | None = None) -> Any:
        return await self.stub.ListVoices(pb.ListVoicesRequest(), timeout=timeout, metadata=self.connection.metadata)

    async def create_voice(self, reference: VoiceReference, timeout: float | None = None) -> Any:
        return await self.stub.CreateVoice(reference.to_proto(), timeout=timeout, metadata=self.connection.metadata)

    async def get_voice(self, voice_id: str, timeout: float | None = None) -> Any:
        return await self.stub.GetVoice(pb.GetVoiceRequest(voice_id=voice_id), timeout=timeout,
                                        metadata=self.connection.metadata)

    async def delete_voice(self, voice_id: str, timeout: float | None = None) -> None:
        await self.stub.DeleteVoice(pb.DeleteVoiceRequest(voice_id=voice_id), timeout=timeout,
                                    metadata=self.connection.metadata)

    async def synthesize(self, text: str, voice: Voice | None = None, audio_format: AudioFormat | None = None,
                         generation: Generation | None = None, timeout: float | None = None,
                         word_timestamps: bool = False) -> Any:
        return await self.stub.Synthesize(synthesize_request(text, voice, audio_format, generation, word_timestamps),
                                          timeout=timeout, metadata=self.connection.metadata)

    def synthesize_online(self, text: str, voice: Voice | None = None, audio_format: AudioFormat | None = None,
                          generation: Generation | None = None, timeout: float | None = None,
                          word_timestamps: bool = False) -> Any:
        """The call: `async for response in call`, or `call.cancel()`."""
        return self.stub.SynthesizeOnline(synthesize_request(text, voice, audio_format, generation, word_timestamps),
                                          timeout=timeout, metadata=self.connection.metadata)

    def streaming_synthesize(self, fragments: AsyncIterable[StreamItem] | Iterable[StreamItem],
                             voice: Voice | None = None, audio_format: AudioFormat | None = None,
                             generation: Generation | None = None, timeout: float | None = None,
                             utterance_id: str = "", word_timestamps: bool = False) -> Any:
        """The call: `async for response in call`; fragments may be an async iterable (e.g. an LLM's tokens).

        When the call ends (its deadline, or an error from the server) while a fragment is being
        written, grpc's asyncio client can report INTERNAL "Internal error from Core" instead of the
        call's real status (grpc/grpc#36066); the blocking TtsClient reports the real one.
        """

        async def requests() -> AsyncIterator[Any]:
            yield streaming_config(voice, audio_format, generation, utterance_id, word_timestamps)
            if isinstance(fragments, AsyncIterable):
                async for fragment in fragments:
                    yield fragment_request(fragment)
            else:
                for fragment in fragments:
                    yield fragment_request(fragment)

        return self.stub.StreamingSynthesize(requests(), timeout=timeout, metadata=self.connection.metadata)
