"""The `qwen3-tts` command against a live server: voices, say (streamed and unary), stream from stdin."""

from __future__ import annotations

import os
import wave
from pathlib import Path

import pytest

from clients.qwen3_tts_client.cli import main
from tests.service.helpers import SAMPLES_PER_FRAME, RunningServer


def run(server: RunningServer, *argv: str) -> int:
    return main(["--server", server.target, *argv])


def test_voices_prints_the_model_and_its_speakers(custom_voice_server: RunningServer,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert run(custom_voice_server, "voices") == 0
    out = capsys.readouterr().out
    assert "custom_voice" in out and "eric (sichuan_dialect)" in out and "ogg_opus: 8000, 16000, 24000, 48000" in out


@pytest.mark.parametrize("mode", [[], ["--unary"]], ids=["streamed", "unary"])
def test_say_writes_a_wav_file_whose_header_states_its_real_length(custom_voice_server: RunningServer,
                                                                   tmp_path: Path, mode: list[str],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "hello.wav"
    assert run(custom_voice_server, "say", "Hello there.", "--speaker", "ryan", "--temperature", "0",
               "-o", str(output), "--sample-rate", "16000", *mode) == 0
    with wave.open(str(output)) as wav:
        assert wav.getframerate() == 16000 and wav.getnchannels() == 1
        num_frames = wav.getnframes()
        assert len(wav.readframes(num_frames)) == 2 * num_frames == output.stat().st_size - 44
    assert "wrote" in capsys.readouterr().err
    assert num_frames % (SAMPLES_PER_FRAME * 2 // 3) == 0  # whole 80 ms codec frames at 16 kHz


def test_stream_speaks_text_from_stdin_into_the_encoding_its_suffix_names(custom_voice_server: RunningServer,
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"Hello there, friend.")
    os.close(write_end)
    monkeypatch.setattr("sys.stdin", os.fdopen(read_end))
    output = tmp_path / "speech.ulaw"
    assert run(custom_voice_server, "stream", "--speaker", "ryan", "-o", str(output), "--sample-rate", "8000") == 0
    assert output.stat().st_size > 0 and output.stat().st_size % 640 == 0  # 80 ms frames of 8-bit samples at 8 kHz


def test_a_refused_request_exits_with_the_status_on_stderr(custom_voice_server: RunningServer, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert run(custom_voice_server, "say", "Hi.", "--speaker", "bob", "-o", str(tmp_path / "x.wav")) == 1
    assert "INVALID_ARGUMENT: voice.speaker: unknown speaker 'bob'" in capsys.readouterr().err
