"""Voice cloning through the API on the tiny Base model: reference audio as a file or raw PCM16."""

from __future__ import annotations

import io

import grpc
import numpy as np
import pytest
import soundfile as sf

from clients.qwen3_tts_client import AudioFormat, TtsClient, Voice, tts_pb2
from tests.service.helpers import GREEDY
from tests.signals import sweep_signal

pb = tts_pb2
REFERENCE_TEXT = "A short reference sentence."


def pcm16_samples(seed: int, seconds: float = 1.0, rate: int = 16000) -> np.ndarray:
    signal = sweep_signal(int(seconds * rate), seed=seed, base_hz=200.0 + 300 * seed, sample_rate=rate)
    return np.round(np.clip(signal, -1, 1) * 32767).astype("<i2")


def wav_file(samples: np.ndarray, rate: int = 16000) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def audio(client: TtsClient, voice: Voice) -> np.ndarray:
    response = client.synthesize("Cloned speech.", voice, AudioFormat("pcm16"), GREEDY)
    assert response.completion.usage.audio_frames >= 2
    return np.frombuffer(response.audio, dtype="<i2").astype(np.int32)


def test_list_voices_reports_a_voice_clone_model_without_speakers(base_client: TtsClient) -> None:
    voices = base_client.list_voices()
    assert voices.mode == pb.MODEL_MODE_VOICE_CLONE and voices.supports_in_context_clone
    assert not voices.speakers and not voices.accepts_instruction


def test_a_raw_pcm16_reference_clones_the_same_voice_as_the_same_samples_in_a_wav_file(base_client: TtsClient) -> None:
    samples = pcm16_samples(seed=0)
    from_file = audio(base_client, Voice(reference_audio=wav_file(samples), reference_text=REFERENCE_TEXT))
    from_raw = audio(base_client, Voice(reference_audio=samples.tobytes(), reference_audio_pcm16_rate=16000,
                                        reference_text=REFERENCE_TEXT))
    other_voice = audio(base_client, Voice(reference_audio=wav_file(pcm16_samples(seed=3)),
                                           reference_text=REFERENCE_TEXT))
    assert np.abs(from_file - from_raw).max() <= 2
    assert from_file.shape != other_voice.shape or np.abs(from_file - other_voice).max() > 2


def test_x_vector_cloning_needs_no_transcript_and_works_with_streamed_text(base_client: TtsClient) -> None:
    voice = Voice(reference_audio=wav_file(pcm16_samples(seed=1)), x_vector_only=True)
    whole = audio(base_client, voice)
    responses = list(base_client.streaming_synthesize(["Clo", "ned spe", "ech."], voice, AudioFormat("pcm16"),
                                                      GREEDY))
    streamed = np.frombuffer(b"".join(r.chunk.audio for r in responses), dtype="<i2").astype(np.int32)
    assert streamed.shape == whole.shape and np.abs(streamed - whole).max() <= 2


def test_in_context_cloning_with_streamed_text_starts_once_the_text_is_closed(base_client: TtsClient) -> None:
    voice = Voice(reference_audio=wav_file(pcm16_samples(seed=2)), reference_text=REFERENCE_TEXT)
    responses = list(base_client.streaming_synthesize(["Cloned ", "speech."], voice, AudioFormat("pcm16"), GREEDY))
    assert responses[-1].completion.usage.audio_frames >= 2
    assert np.abs(np.frombuffer(b"".join(r.chunk.audio for r in responses), "<i2").astype(np.int32)
                  - audio(base_client, voice)).max() <= 2


BAD_CLONES = {
    "unreadable audio": (Voice(reference_audio=b"this is not audio", reference_text=REFERENCE_TEXT),
                         "voice.reference_audio: reference audio is not audio in a readable format"),
    "odd-sized raw PCM16": (Voice(reference_audio=b"\x00" * 16001, reference_audio_pcm16_rate=16000,
                                  x_vector_only=True), "voice.reference_audio: raw PCM16 reference audio"),
    "reference too long": (Voice(reference_audio=wav_file(pcm16_samples(seed=0, seconds=6.0)), x_vector_only=True),
                           "voice.reference_audio: reference audio is 6.0 s long; at most 5 s"),
    "no transcript for in-context cloning": (Voice(reference_audio=wav_file(pcm16_samples(seed=0))),
                                             "voice.reference_text: in-context cloning needs the transcript"),
    "no reference at all": (Voice(), "voice.reference_audio: the loaded base model clones a voice"),
    "a speaker on a clone model": (Voice(speaker="ryan", reference_audio=wav_file(pcm16_samples(seed=0)),
                                         x_vector_only=True), "voice.speaker"),
}


@pytest.mark.parametrize("case", BAD_CLONES, ids=list(BAD_CLONES))
def test_bad_clone_requests_get_invalid_argument_naming_the_field(base_client: TtsClient, case: str) -> None:
    voice, message = BAD_CLONES[case]
    with pytest.raises(grpc.RpcError) as caught:
        base_client.synthesize("Hi.", voice, generation=GREEDY)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.details()
    assert audio(base_client, Voice(reference_audio=wav_file(pcm16_samples(seed=0)), x_vector_only=True)).size
