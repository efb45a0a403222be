"""A listener well ahead of playback gets fewer, larger messages; its first audio still leaves a frame at a time."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator

import pytest

from clients.qwen3_tts_client import Generation
from tests.service.helpers import RYAN, RunningServer, start_server
from tts_service.api import speech as speech_module
from tts_service.api.speech import ListenerLead
from tts_service.model.checkpoint import LoadedModel

FRAME_S = 0.08
FOUR_SECONDS = Generation(temperature=0.0, max_audio_seconds=4.0)


@pytest.fixture(scope="module")
def pacing_server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(tiny_models["custom_voice"], max_audio_seconds=4.0, coalesce_when_ahead_seconds=0.3,
                           coalesced_message_seconds=0.32)
    yield running
    running.stop()


def ten_times_slower() -> float:
    return time.monotonic() / 10


def message_durations(server: RunningServer) -> list[float]:
    with server.client() as client:
        responses = client.synthesize_online("Keep talking while the listener is far ahead.", RYAN,
                                             generation=FOUR_SECONDS)
        return [response.chunk.duration_seconds for response in responses if response.chunk.num_samples]


def test_once_the_listener_is_ahead_each_message_but_the_last_carries_at_least_the_coalesced_audio(
        pacing_server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # The listener plays at a tenth of real speed, so the tiny model outruns it on any CPU; at real speed how soon
    # it gets ahead depends on the machine (on two loaded cores, up to 2.5 s of 4).
    monkeypatch.setattr(speech_module, "ListenerLead", functools.partial(ListenerLead, clock=ten_times_slower))
    durations = message_durations(pacing_server)
    assert sum(durations) == pytest.approx(4.0)
    assert durations[0] == pytest.approx(FRAME_S)  # the first audio does not wait for company
    coalesced_from = next(index for index, duration in enumerate(durations) if duration >= 0.32 - 1e-9)
    assert sum(durations[:coalesced_from]) < 1.0, durations
    assert all(duration >= 0.32 - 1e-9 for duration in durations[coalesced_from:-1]), durations
