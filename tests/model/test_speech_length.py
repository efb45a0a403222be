"""A random-weight model's default audio length is about what reading its text takes, so a first run finishes in
seconds; a real checkpoint keeps the cap, since it ends speech by itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import soundfile

from tts_service.eager import command
from tts_service.model.speech_length import estimated_speech_seconds


@pytest.mark.parametrize(("text", "low_s", "high_s"), [
    ("Hello from Qwen3-TTS.", 1.0, 2.0),
    ("The quick brown fox jumps over the lazy dog, and then it runs far away into the woods.", 3.5, 6.5),
    ("今天天气很好，我们去公园散步吧。", 2.5, 4.0),
    ("", 1.0, 1.0),
])
def test_the_estimate_is_about_how_long_reading_the_text_aloud_takes(text: str, low_s: float, high_s: float) -> None:
    assert low_s <= estimated_speech_seconds(text) <= high_s


def test_chinese_takes_longer_a_character_than_english() -> None:
    assert estimated_speech_seconds("你好" * 20) > 2 * estimated_speech_seconds("ab" * 20)


def test_the_quick_start_command_on_random_weights_writes_about_the_texts_length_of_audio(tmp_path: Path) -> None:
    output = tmp_path / "hello.wav"
    assert command.main(["Hello from Qwen3-TTS.", "-o", str(output), "--model", "random:tiny-custom_voice",
                         "--device", "cpu"]) == 0
    seconds = soundfile.info(str(output)).duration
    assert 0.5 <= seconds <= 2.5


def test_an_explicit_cap_still_wins_on_random_weights(tmp_path: Path) -> None:
    output = tmp_path / "long.wav"
    assert command.main(["Hi.", "-o", str(output), "--model", "random:tiny-custom_voice", "--device", "cpu",
                         "--max-seconds", "3.2"]) == 0
    assert soundfile.info(str(output)).duration == pytest.approx(3.2, abs=0.1)
