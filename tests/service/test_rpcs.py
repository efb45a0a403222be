"""Every RPC end to end over a real socket, and every audio encoding read back by a real decoder."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import soundfile as sf
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from clients.qwen3_tts_client import AudioFormat, Flush, Generation, TtsClient, tts_pb2
from qwen3_tts.v1.protocol import SERVICE_NAME
from tests.service.helpers import GREEDY, NATIVE_RATE, RYAN, SAMPLES_PER_FRAME, RunningServer, wait_until

pb = tts_pb2
TEXT = "Hello there, friend."
MAX_FRAMES = 6  # the test server's max_audio_seconds (0.48 s) in 80 ms frames
HEADERLESS_SUBTYPES = {"pcm16": "PCM_16", "mulaw": "ULAW", "alaw": "ALAW"}


def decode(data: bytes, audio_format: AudioFormat) -> tuple[np.ndarray, int]:
    """libsndfile reads containers from their header and headerless bytes as RAW of the right subtype."""
    if audio_format.encoding in ("wav", "ogg_opus", "mp3"):
        return sf.read(io.BytesIO(data), dtype="float32")
    samples, _ = sf.read(io.BytesIO(data), samplerate=audio_format.sample_rate, channels=1, format="RAW",
                         subtype=HEADERLESS_SUBTYPES[audio_format.encoding], endian="LITTLE", dtype="float32")
    return samples, audio_format.sample_rate


def expected_samples(num_frames: int, sample_rate: int) -> int:
    return round(num_frames * SAMPLES_PER_FRAME * sample_rate / NATIVE_RATE)


def assert_decodes_to(data: bytes, audio_format: AudioFormat, num_frames: int) -> None:
    samples, rate = decode(data, audio_format)
    expected = expected_samples(num_frames, audio_format.sample_rate)
    assert rate == audio_format.sample_rate
    if audio_format.encoding == "ogg_opus":  # a decoder may keep up to one 20 ms Opus frame of end padding
        assert expected <= len(samples) <= expected + rate // 50
    elif audio_format.encoding == "mp3":  # untagged: the codec's delay before, the last frame's padding after
        assert expected <= len(samples) <= expected + 3 * 1152
    else:
        assert len(samples) == expected
    assert np.abs(samples).max() > 0  # audio, not silence


def pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.int32)


def test_list_voices_describes_the_loaded_model_and_the_server_limits(custom_voice_server: RunningServer,
                                                                     client: TtsClient) -> None:
    voices = client.list_voices()
    assert voices.model == custom_voice_server.model.source and voices.mode == pb.MODEL_MODE_CUSTOM_VOICE
    assert {"ryan", "eric"} <= {speaker.name for speaker in voices.speakers}
    assert {speaker.name: speaker.dialect for speaker in voices.speakers}["eric"] == "sichuan_dialect"
    assert "auto" in voices.languages and "english" in voices.languages
    assert voices.native_sample_rate == NATIVE_RATE and voices.accepts_instruction
    rates = {support.encoding: list(support.sample_rates) for support in voices.output_formats}
    assert set(rates) == {pb.AUDIO_ENCODING_PCM16, pb.AUDIO_ENCODING_WAV, pb.AUDIO_ENCODING_OGG_OPUS,
                          pb.AUDIO_ENCODING_MULAW, pb.AUDIO_ENCODING_ALAW, pb.AUDIO_ENCODING_MP3}
    assert 44100 in rates[pb.AUDIO_ENCODING_MP3]
    assert 44100 in rates[pb.AUDIO_ENCODING_WAV] and 44100 not in rates[pb.AUDIO_ENCODING_OGG_OPUS]
    assert voices.limits.max_audio_seconds == pytest.approx(0.48) and voices.limits.max_text_chars == 400


def test_synthesize_answers_with_one_wav_file_as_long_as_the_generated_frames(client: TtsClient) -> None:
    response = client.synthesize(TEXT, RYAN, generation=GREEDY)
    usage = response.completion.usage
    samples, rate = sf.read(io.BytesIO(response.audio), dtype="float32")
    assert rate == NATIVE_RATE and response.mime_type == "audio/wav"
    assert response.audio_format.encoding == pb.AUDIO_ENCODING_WAV and response.audio_format.sample_rate == NATIVE_RATE
    assert 2 <= usage.audio_frames <= MAX_FRAMES and len(samples) == usage.audio_frames * SAMPLES_PER_FRAME
    assert usage.audio_seconds == pytest.approx(usage.audio_frames * 0.08)
    assert usage.input_tokens > 0 and len(response.completion.request_id) == 32
    if response.completion.finish_reason == pb.FINISH_REASON_LENGTH:
        assert usage.audio_frames == MAX_FRAMES
    else:
        assert response.completion.finish_reason == pb.FINISH_REASON_STOPPED


def test_synthesize_online_streams_contiguous_chunks_that_join_into_the_whole_utterance(client: TtsClient) -> None:
    audio_format = AudioFormat("pcm16", 24000)
    call = client.synthesize_online(TEXT, RYAN, audio_format, GREEDY)
    responses = list(call)
    request_id = dict(call.initial_metadata())["x-request-id"]
    chunks = [response.chunk for response in responses if response.HasField("chunk")]
    assert len(chunks) >= 2  # audio arrives as it is decoded, not at the end
    position = 0
    for chunk in chunks:
        assert chunk.offset_samples == position and len(chunk.audio) == 2 * chunk.num_samples
        assert chunk.offset_seconds == pytest.approx(position / 24000)
        assert chunk.duration_seconds == pytest.approx(chunk.num_samples / 24000)
        position += chunk.num_samples
    completions = [response.completion for response in responses if response.HasField("completion")]
    assert len(completions) == 1 and responses[-1].HasField("completion")
    assert completions[0].request_id == request_id
    assert position == completions[0].usage.audio_frames * SAMPLES_PER_FRAME
    unary = client.synthesize(TEXT, RYAN, audio_format, GREEDY)
    assert np.abs(pcm16(b"".join(chunk.audio for chunk in chunks)) - pcm16(unary.audio)).max() <= 2


FORMATS = [AudioFormat("pcm16", 16000), AudioFormat("wav", 24000), AudioFormat("wav", 44100),
           AudioFormat("ogg_opus", 48000), AudioFormat("mulaw", 8000), AudioFormat("alaw", 8000),
           AudioFormat("mp3", 22050), AudioFormat("mp3", 44100, bit_rate_kbps=128)]


@pytest.mark.parametrize("audio_format", FORMATS, ids=lambda f: f"{f.encoding}-{f.sample_rate}")
def test_every_encoding_decodes_at_the_requested_rate_and_length_whole_and_streamed(
        client: TtsClient, audio_format: AudioFormat) -> None:
    generation = Generation(temperature=0.0, max_audio_seconds=0.24)
    whole = client.synthesize(TEXT, RYAN, audio_format, generation)
    assert_decodes_to(whole.audio, audio_format, whole.completion.usage.audio_frames)
    responses = list(client.synthesize_online(TEXT, RYAN, audio_format, generation))
    streamed = b"".join(response.chunk.audio for response in responses)
    assert_decodes_to(streamed, audio_format, responses[-1].completion.usage.audio_frames)


def test_a_flush_is_answered_with_its_marker_in_order_with_the_audio(client: TtsClient) -> None:
    responses = list(client.streaming_synthesize(["Hello ", Flush("after-hello"), "there."], RYAN,
                                                 generation=GREEDY))
    acks = [response.flush_ack.marker for response in responses if response.HasField("flush_ack")]
    assert acks == ["after-hello"]
    assert responses[-1].HasField("completion") and not responses[-1].HasField("flush_ack")
    assert responses[-1].completion.usage.audio_frames >= 2


def held_open(fragments: list[str], release: threading.Event) -> Iterator[str]:
    """Fragments, then an input that stays open (no half-close) until `release` is set."""
    yield from fragments
    release.wait(timeout=30)


def test_cancelling_a_stream_ends_its_request_in_the_engine_at_once(custom_voice_server: RunningServer,
                                                                     client: TtsClient) -> None:
    release = threading.Event()
    call = client.streaming_synthesize(held_open(["Hi "], release), RYAN)
    try:
        assert next(call).HasField("chunk")  # generating; then it waits for more text, holding its slot
        assert custom_voice_server.engine.num_live_requests == 1
        call.cancel()
        # Well before the 1.5 s idle timeout, which would also end it.
        assert wait_until(lambda: custom_voice_server.engine.num_live_requests == 0, timeout_s=1.0)
    finally:
        release.set()
    assert custom_voice_server.engine.scheduler.num_kv_blocks_used == 0


def test_a_passed_deadline_ends_the_call_and_its_request_in_the_engine(custom_voice_server: RunningServer,
                                                                        client: TtsClient) -> None:
    release = threading.Event()
    call = client.streaming_synthesize(held_open(["Hi "], release), RYAN, timeout=0.5)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            list(call)
        assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert wait_until(lambda: custom_voice_server.engine.num_live_requests == 0, timeout_s=0.5)
    finally:
        release.set()


def test_an_idle_text_stream_is_ended_with_deadline_exceeded_naming_the_idle_limit(
        custom_voice_server: RunningServer, client: TtsClient) -> None:
    release = threading.Event()
    try:
        with pytest.raises(grpc.RpcError) as caught:
            list(client.streaming_synthesize(held_open(["Hi "], release), RYAN))
        assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert "no text arrived for 1.5 s" in caught.value.details()
    finally:
        release.set()
    assert wait_until(lambda: custom_voice_server.engine.num_live_requests == 0, timeout_s=1.0)


def test_reflection_lists_the_service_and_describes_its_methods(client: TtsClient) -> None:
    database = ProtoReflectionDescriptorDatabase(client.channel)
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= set(database.get_services())
    service = DescriptorPool(database).FindServiceByName(SERVICE_NAME)
    assert {method.name for method in service.methods} == {"ListVoices", "Synthesize", "SynthesizeOnline",
                                                           "StreamingSynthesize", "CreateVoice", "GetVoice",
                                                           "DeleteVoice", "CreateLexicon", "GetLexicon",
                                                           "ListLexicons", "DeleteLexicon"}
