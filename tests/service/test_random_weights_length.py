"""On random weights, which never end speech by themselves, a request that sets no length makes about as long as
reading its text aloud takes, so a first run answers in seconds; a set length, streamed text and real checkpoints
keep the cap."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from clients.qwen3_tts_client import Generation
from tests.service.helpers import RYAN, RunningServer, start_server
from tts_service.model.checkpoint import LoadedModel, LoadOptions
from tts_service.model.loading import load_model

TEXT = "Hello from Qwen3-TTS."
MAX_AUDIO_SECONDS = 8.0


@pytest.fixture(scope="module")
def random_server() -> Iterator[RunningServer]:
    server = start_server(load_model("random:tiny-custom_voice", LoadOptions.default_for("cpu")),
                          max_audio_seconds=MAX_AUDIO_SECONDS)
    yield server
    server.stop()


def test_a_request_with_no_length_makes_about_its_texts_reading_time(random_server: RunningServer) -> None:
    with random_server.client() as client:
        usage = client.synthesize(TEXT, RYAN, generation=Generation(temperature=0.0)).completion.usage
    assert 0.5 <= usage.audio_seconds <= 2.5


def test_a_set_length_still_wins(random_server: RunningServer) -> None:
    with random_server.client() as client:
        usage = client.synthesize(TEXT, RYAN, generation=Generation(temperature=0.0, max_audio_seconds=4.0)
                                  ).completion.usage
    assert usage.audio_seconds == pytest.approx(4.0, abs=0.1)


def test_a_real_checkpoint_keeps_the_cap(tiny_models: dict[str, LoadedModel]) -> None:
    server = start_server(tiny_models["custom_voice"], max_audio_seconds=3.0)
    try:
        with server.client() as client:
            usage = client.synthesize(TEXT, RYAN, generation=Generation(temperature=0.0)).completion.usage
    finally:
        server.stop()
    # The tiny checkpoint's weights are random too, but loaded from disk as a real checkpoint is: it never ends
    # speech, so it runs to the cap, as a real model that failed to stop would.
    assert usage.audio_seconds == pytest.approx(3.0, abs=0.1)
