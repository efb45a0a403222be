"""Voices cloned from inline reference audio are kept by caller and recording: the same recording sent again is not
decoded and encoded again, and speaks the same voice."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from clients.qwen3_tts_client import Voice
from tests.service.helpers import RunningServer, start_server
from tests.service.test_voice_clone import REFERENCE_TEXT, audio, pcm16_samples, wav_file
from tts_service.api import speech
from tts_service.api.inline_clones import inline_clone_key
from tts_service.api.interceptors import MAX_BYTES_PARSED_ON_LOOP
from tts_service.model.checkpoint import LoadedModel
from tts_service.model.prompts import VoiceClone


def reference(**fields: Any) -> Voice:
    return Voice(**{"reference_audio": b"RIFF-recording", "reference_text": "Words.", **fields})


def test_a_kept_clone_is_named_by_its_caller_and_every_field_of_its_reference() -> None:
    key = inline_clone_key("alice", reference())
    assert key == inline_clone_key("alice", reference())
    others = [inline_clone_key("bob", reference()), inline_clone_key("alice", reference(reference_audio=b"other")),
              inline_clone_key("alice", reference(reference_text="Other words.")),
              inline_clone_key("alice", reference(reference_audio_pcm16_rate=16000)),
              inline_clone_key("alice", reference(x_vector_only=True))]
    assert key not in others and len(set(others)) == len(others)


@pytest.fixture(params=[256, 0], ids=["kept", "encoded-every-call"])
def counted_server(request: pytest.FixtureRequest, tiny_models: dict[str, LoadedModel]
                   ) -> Iterator[tuple[RunningServer, list[int]]]:
    server = start_server(tiny_models["base"], max_inline_clones=request.param)
    engine = server.engine
    encoded: list[int] = []
    encode = engine.clone_voice

    async def counting_clone_voice(*args: Any) -> VoiceClone:
        encoded.append(1)
        return await encode(*args)

    engine.clone_voice = counting_clone_voice  # type: ignore[method-assign]
    try:
        yield server, encoded
    finally:
        server.stop()


def test_the_same_recording_sent_again_is_encoded_once_and_speaks_the_same_voice(
        counted_server: tuple[RunningServer, list[int]]) -> None:
    server, encoded = counted_server
    voice = Voice(reference_audio=wav_file(pcm16_samples(seed=0)), reference_text=REFERENCE_TEXT)
    other = Voice(reference_audio=wav_file(pcm16_samples(seed=3)), reference_text=REFERENCE_TEXT)
    with server.client() as client:
        first, again = audio(client, voice), audio(client, voice)
        audio(client, other)
    is_kept = server.server.config.max_inline_clones > 0
    assert len(encoded) == (2 if is_kept else 3)
    assert np.array_equal(first, again)


def test_a_large_recordings_key_is_taken_off_the_event_loop(counted_server: tuple[RunningServer, list[int]],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A digest of megabytes would stall every other call on the loop, as parsing them would."""
    server, _ = counted_server
    threads: list[str] = []
    real_key = speech.inline_clone_key

    def recording_thread(caller: str, voice: Any) -> bytes:
        threads.append(threading.current_thread().name)
        return real_key(caller, voice)

    monkeypatch.setattr(speech, "inline_clone_key", recording_thread)
    small = Voice(reference_audio=wav_file(pcm16_samples(seed=0)), reference_text=REFERENCE_TEXT)
    large = Voice(reference_audio=wav_file(pcm16_samples(seed=0, seconds=4.0)), reference_text=REFERENCE_TEXT)
    assert len(small.reference_audio) <= MAX_BYTES_PARSED_ON_LOOP < len(large.reference_audio)
    with server.client() as client:
        audio(client, small)
        audio(client, large)
    assert threads[0] == server.thread.name and threads[1] != server.thread.name
