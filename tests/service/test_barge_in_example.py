"""clients/examples/barge_in.py against an in-process server with the random tiny aligner: turns spoken one after
another on one call, the barged-in turn cancelled after the audio the user let play, the words reported heard only
those timed within it, and the next turn spoken in full on the same call. Its simulated loudspeaker is checked on a
clock the test turns by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from clients.examples import barge_in
from clients.examples.barge_in import Player, Turn
from tests.service.helpers import RunningServer, start_server
from tts_service.model.aligner_text import split_words
from tts_service.model.checkpoint import LoadedModel

# The loudspeaker plays faster than real time, so that the test waits less; it still stalls when generation lags.
SPEED = 3.0


@pytest.fixture(scope="module")
def server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    # The random model speaks for about as long as its text takes to read: room for whole turns, and for the
    # pauses between them while the last turn plays out.
    running = start_server(tiny_models["custom_voice"], aligner_model="random:tiny", max_audio_seconds=20.0,
                           stream_idle_timeout_seconds=30.0)
    yield running
    running.stop()


def words_of(text: str) -> tuple[str, ...]:
    return tuple(word.text for word in split_words(text))


def test_the_barged_in_turn_is_cancelled_and_the_call_goes_on_with_the_next(
        server: RunningServer, capsys: pytest.CaptureFixture[str]) -> None:
    turns = barge_in.TURNS
    reports = asyncio.run(barge_in.main(server.target, turns, speed=SPEED))

    assert [report.turn_id for report in reports] == ["turn-1", "turn-2", "turn-3"]
    first, cut, last = reports
    barge_in_s = turns[1].barge_in_after_s
    assert barge_in_s is not None
    assert cut.finish_reason == "cancelled"
    # The user spoke once this much had played; the loudspeaker stopped there (give or take the example's polling
    # and a busy CPU), well before the turn's end.
    assert barge_in_s <= cut.heard_seconds < barge_in_s + 1.0 < first.heard_seconds
    # Heard: the turn's first words at most, those timed before the cut (the random aligner times none so early).
    assert cut.heard_words == words_of(turns[1].text)[:len(cut.heard_words)]
    for report, turn in ((first, turns[0]), (last, turns[2])):
        assert report.finish_reason in ("stopped", "length")
        assert report.heard_words == words_of(turn.text)  # played to its end: every word heard
        assert report.heard_seconds > barge_in_s
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].startswith("turn-2: cancelled, ") and len(printed) == 3


def test_a_turn_the_user_never_interrupts_is_heard_to_its_last_word(server: RunningServer) -> None:
    text = "Just one short turn. Nothing more."
    (report,) = asyncio.run(barge_in.main(server.target, (Turn(text),), speed=SPEED))
    assert report.finish_reason in ("stopped", "length")
    assert report.heard_words == words_of(text)


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_player_plays_only_what_it_received_and_stops_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock()
    monkeypatch.setattr(barge_in.time, "monotonic", clock)
    player = Player(speed=2.0)
    clock.now += 5
    assert player.played_s() == 0.0  # nothing plays before the first audio
    player.receive(1.0)
    clock.now += 0.25
    assert player.played_s() == 0.5  # two seconds of audio a second
    clock.now += 10
    assert player.played_s() == 1.0  # then it stalls: it cannot play audio it has not received
    player.receive(2.0)
    clock.now += 0.5
    assert player.played_s() == 2.0  # and goes on from where it stalled once more arrives
    assert player.stop() == 2.0
    player.receive(5.0)
    clock.now += 10
    assert player.played_s() == 2.0  # stopped: the user is speaking
