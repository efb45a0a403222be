"""`qwen3-tts say|stream --timestamps`: each word's timing printed to stderr as it arrives, or written as JSON lines
by --timestamps-out, leaving the audio exactly as it is without them; a timings file it cannot write, or one that
would share stdout with the audio, is refused naming its flag before any call.

The server runs the random tiny aligner: its timings are noise, but which words come, with which offsets, is the
server's and is checked against the aligner's own word split."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import soundfile as sf

from clients.qwen3_tts_client import TtsClient, tts_pb2
from clients.qwen3_tts_client.cli import main
from tests.service.helpers import RunningServer, start_server
from tts_service.model.aligner_text import split_words
from tts_service.model.checkpoint import LoadedModel

REPOSITORY = Path(__file__).resolve().parents[2]
TEXT = "Hello there, friend. How are you today?"
WORD_KEYS = {"word", "start_char", "end_char", "start_seconds", "end_seconds"}
MAX_AUDIO_SECONDS = 4.0
CLI_TIMEOUT_S = 120.0
# Greedy, so that two calls with the same text make the same audio.
SAY = ("--speaker", "ryan", "--language", "english", "--temperature", "0", "--sample-rate", "16000")


@pytest.fixture(scope="module")
def server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    # Room for the text's two sentences.
    running = start_server(tiny_models["custom_voice"], aligner_model="random:tiny",
                           max_audio_seconds=MAX_AUDIO_SECONDS)
    yield running
    running.stop()


def run(server: RunningServer, *argv: str) -> int:
    return main(["--server", server.target, *argv])


def expected_words(text: str) -> list[tuple[str, int, int]]:
    return [(word.text, word.start_char, word.end_char) for word in split_words(text)]


def word_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("word ")]


def printed_words(stderr: str) -> list[tuple[str, int, int]]:
    """(word, start_char, end_char) from the CLI's 'word 0.240-0.560 s: Hello [0:5]' lines."""
    words = []
    for line in word_lines(stderr):
        word, span = line.split(": ", 1)[1].rsplit(" ", 1)
        start, end = span.strip("[]").split(":")
        words.append((word, int(start), int(end)))
    return words


def json_words(lines: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines.splitlines()]


def check_json_words(records: list[dict[str, Any]], text: str, audio_seconds: float) -> None:
    assert all(set(record) == WORD_KEYS for record in records)
    assert [(r["word"], r["start_char"], r["end_char"]) for r in records] == expected_words(text)
    assert all(0 <= r["start_seconds"] <= r["end_seconds"] <= audio_seconds + 1e-6 for r in records)


@pytest.mark.parametrize("mode", [[], ["--unary"]], ids=["streamed", "unary"])
def test_say_prints_every_word_to_stderr_and_writes_the_same_audio_as_without(
        server: RunningServer, tmp_path: Path, mode: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    plain, timed = tmp_path / "plain.wav", tmp_path / "timed.wav"
    assert run(server, "say", TEXT, *SAY, "-o", str(plain), *mode) == 0
    capsys.readouterr()
    assert run(server, "say", TEXT, *SAY, "-o", str(timed), "--timestamps", *mode) == 0
    stderr = capsys.readouterr().err
    assert printed_words(stderr) == expected_words(TEXT)
    assert timed.read_bytes() == plain.read_bytes()
    assert "wrote" in stderr.splitlines()[-1]  # the summary still comes last, after the words


@pytest.mark.parametrize("mode", [[], ["--unary"]], ids=["streamed", "unary"])
def test_timestamps_out_writes_json_lines_and_leaves_stderr_to_the_summary(
        server: RunningServer, tmp_path: Path, mode: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    output, timings = tmp_path / "hello.wav", tmp_path / "words.jsonl"
    assert run(server, "say", TEXT, *SAY, "-o", str(output), "--timestamps-out", str(timings), *mode) == 0
    assert word_lines(capsys.readouterr().err) == []
    check_json_words(json_words(timings.read_text(encoding="utf-8")), TEXT, sf.info(str(output)).duration)


def test_stream_writes_timings_to_stdout_while_the_audio_goes_to_a_file(
        server: RunningServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, TEXT.encode())
    os.close(write_end)
    monkeypatch.setattr("sys.stdin", os.fdopen(read_end))
    output = tmp_path / "streamed.wav"
    assert run(server, "stream", *SAY, "-o", str(output), "--timestamps-out", "-") == 0
    check_json_words(json_words(capsys.readouterr().out), TEXT, sf.info(str(output)).duration)


def test_audio_on_stdout_stays_a_clean_wav_while_the_words_go_to_stderr(server: RunningServer) -> None:
    command = [sys.executable, "-m", "clients.qwen3_tts_client.cli", "--server", server.target, "say", TEXT, *SAY,
               "-o", "-", "--timestamps"]
    finished = subprocess.run(command, cwd=REPOSITORY, capture_output=True, timeout=CLI_TIMEOUT_S, check=False)
    stderr = finished.stderr.decode()
    assert finished.returncode == 0, stderr
    samples, rate = sf.read(io.BytesIO(finished.stdout))
    assert rate == 16000 and len(samples) > 0
    assert printed_words(stderr) == expected_words(TEXT)


def test_each_words_message_is_written_out_before_the_next_response_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # A scripted call, so that "as it arrives" is checked whenever the server sends words: between its messages,
    # the timings file must already hold every word sent so far.
    timings = tmp_path / "words.jsonl"
    seen: list[int] = []

    def scripted(*args: Any, **kwargs: Any) -> Iterator[Any]:
        assert kwargs["word_timestamps"] is True
        for words in ([("Hello", 0, 5), ("there", 6, 11)], [("friend", 13, 19)]):
            yield tts_pb2.StreamingSynthesizeResponse(words=tts_pb2.WordTimestamps(words=[
                tts_pb2.WordTiming(word=word, start_char=start, end_char=end) for word, start, end in words]))
            seen.append(len(timings.read_text(encoding="utf-8").splitlines()))
        yield tts_pb2.StreamingSynthesizeResponse(completion=tts_pb2.Completion(request_id="scripted"))

    monkeypatch.setattr(TtsClient, "streaming_synthesize", scripted)
    monkeypatch.setattr("clients.qwen3_tts_client.cli.stdin_fragments", lambda: iter(()))
    assert main(["--server", "127.0.0.1:9", "stream", "-o", str(tmp_path / "x.pcm"),
                 "--timestamps-out", str(timings)]) == 0
    assert seen == [2, 3]
    assert "request scripted" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["-o", "-", "--timestamps-out", "-"], "--timestamps-out: - is stdout, where the audio already goes"),
    (["-o", "x.wav", "--timestamps-out", "no-such-dir/words.jsonl"], "--timestamps-out: cannot write"),
], ids=["both on stdout", "unwritable file"])
def test_a_timings_output_it_cannot_use_is_refused_naming_the_flag_before_any_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    # Port 9 has no server: a refusal that came after trying to call would say UNAVAILABLE instead.
    assert main(["--server", "127.0.0.1:9", "say", "Hi.", *argv]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"qwen3-tts: {message}") and "UNAVAILABLE" not in error
    assert list(tmp_path.iterdir()) == []  # nor is the audio file left behind


def test_a_server_without_an_aligner_fails_the_call_naming_the_flag_it_needs(
        custom_voice_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "x.wav"
    assert run(custom_voice_server, "say", "Hi.", "--speaker", "ryan", "-o", str(output), "--timestamps") == 1
    assert "FAILED_PRECONDITION: word_timestamps:" in capsys.readouterr().err
    assert not output.exists()
