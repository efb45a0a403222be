"""The `qwen3-tts` command against a live server: voices, say (streamed and unary), stream from stdin, output
formats by suffix, files kept on failure, pipes, and errors that name their flag or field."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import threading
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest
import soundfile as sf

from clients.qwen3_tts_client.cli import main
from tests.service.helpers import SAMPLES_PER_FRAME, TEST_CONFIG, RunningServer
from tests.service.test_voice_clone import REFERENCE_TEXT, pcm16_samples, wav_file

REPOSITORY = Path(__file__).resolve().parents[2]
OUTPUT_RATE = 16000
OUTPUT_SAMPLES = round(TEST_CONFIG.engine.max_audio_s * OUTPUT_RATE)  # every test call speaks to the length limit


@pytest.fixture
def closed_port() -> Iterator[str]:
    """An address bound but not listening, so that connecting to it is refused at once."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{bound.getsockname()[1]}"


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


@pytest.mark.parametrize("mode", [[], ["--unary"]], ids=["streamed", "unary"])
@pytest.mark.parametrize("failure", ["bad speaker", "server down"])
def test_a_failed_call_leaves_an_existing_file_byte_for_byte_and_names_what_failed(
        custom_voice_server: RunningServer, closed_port: str, tmp_path: Path, mode: list[str], failure: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "keep.wav"
    assert run(custom_voice_server, "say", "Hello there.", "--speaker", "ryan", "-o", str(output)) == 0
    before = output.read_bytes()
    target, speaker, named = ((custom_voice_server.target, "bob", "voice.speaker: unknown speaker 'bob'")
                              if failure == "bad speaker" else (closed_port, "ryan", f"--server {closed_port}: "))
    capsys.readouterr()
    assert main(["--server", target, "say", "Hi.", "--speaker", speaker, "-o", str(output), *mode]) == 1
    assert named in capsys.readouterr().err
    assert output.read_bytes() == before
    assert list(tmp_path.iterdir()) == [output]  # the temporary file is gone too


@pytest.mark.parametrize("mode", [[], ["--unary"]], ids=["streamed", "unary"])
@pytest.mark.parametrize(("suffix", "container", "subtype"), [
    (".flac", "FLAC", "PCM_16"), (".wav", "WAV", "PCM_16"), (".ogg", "OGG", "OPUS"), (".opus", "OGG", "OPUS"),
    pytest.param(".mp3", "MP3", "MPEG_LAYER_III", marks=pytest.mark.skipif(
        "MP3" not in sf.available_formats(), reason="this libsndfile cannot encode MP3")),
    (".pcm", "RAW", "PCM_16"), (".raw", "RAW", "PCM_16"), (".l16", "RAW", "PCM_16"), (".ulaw", "RAW", "ULAW"),
    (".mulaw", "RAW", "ULAW"), (".alaw", "RAW", "ALAW")])
def test_a_file_is_written_in_the_format_its_suffix_names(custom_voice_server: RunningServer, tmp_path: Path,
                                                          suffix: str, container: str, subtype: str,
                                                          mode: list[str]) -> None:
    output = tmp_path / f"hello{suffix}"
    assert run(custom_voice_server, "say", "Hello there.", "--speaker", "ryan", "-o", str(output),
               "--sample-rate", str(OUTPUT_RATE), *mode) == 0
    if container == "RAW":  # headerless bytes do not state their rate: their count must show it
        samples, _ = sf.read(str(output), format=container, subtype=subtype, endian="LITTLE",
                             samplerate=OUTPUT_RATE, channels=1)
        assert len(samples) == OUTPUT_SAMPLES
    else:
        info = sf.info(str(output))
        assert (info.format, info.subtype, info.samplerate, info.channels) == (container, subtype, OUTPUT_RATE, 1)
        samples, _ = sf.read(str(output))
        assert len(samples) > 0


@pytest.mark.parametrize(("argv", "flag"), [
    (["-o", "hello.xyz"], "-o/--output: "),
    (["-o", "hello"], "-o/--output: "),
    (["-o", "hello.flac", "--encoding", "wav"], "--encoding: "),
], ids=["unknown suffix", "no suffix", "encoding against suffix"])
def test_an_output_it_cannot_write_is_refused_naming_the_flag_before_any_call(
        closed_port: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], flag: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["--server", closed_port, "say", "Hi.", *argv]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"qwen3-tts: {flag}") and "UNAVAILABLE" not in error
    assert list(tmp_path.iterdir()) == []


def test_flac_to_a_fifo_is_refused_for_it_needs_seeking(closed_port: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "speech.flac"
    os.mkfifo(fifo)
    assert main(["--server", closed_port, "say", "Hi.", "-o", str(fifo)]) == 2
    assert capsys.readouterr().err.startswith("qwen3-tts: -o/--output: ")


@pytest.mark.parametrize("output", ["-", "/dev/stdout"])
def test_audio_written_to_a_pipe_is_a_streamed_wav(custom_voice_server: RunningServer, output: str) -> None:
    command = [sys.executable, "-m", "clients.qwen3_tts_client.cli", "--server", custom_voice_server.target, "say",
               "Hello there.", "--speaker", "ryan", "--sample-rate", str(OUTPUT_RATE), "-o", output]
    finished = subprocess.run(command, cwd=REPOSITORY, capture_output=True, timeout=120, check=False)  # stdout: a pipe
    assert finished.returncode == 0, finished.stderr.decode()
    samples, rate = sf.read(io.BytesIO(finished.stdout))
    assert rate == OUTPUT_RATE and len(samples) == OUTPUT_SAMPLES


def test_audio_written_to_a_fifo_arrives_through_it(custom_voice_server: RunningServer, tmp_path: Path) -> None:
    fifo = tmp_path / "speech"
    os.mkfifo(fifo)
    received: list[bytes] = []
    # A daemon, so that a CLI which never opens the FIFO fails this test instead of hanging the run.
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert run(custom_voice_server, "say", "Hello there.", "--speaker", "ryan", "--sample-rate", str(OUTPUT_RATE),
               "-o", str(fifo), "--encoding", "pcm16") == 0
    reader.join(timeout=30)
    assert not reader.is_alive() and len(received[0]) == 2 * OUTPUT_SAMPLES


@pytest.mark.parametrize(("argv", "flag"), [
    (["--seed", "-1"], "--seed"), (["--seed", "4294967296"], "--seed"), (["--top-k", "-1"], "--top-k"),
    (["--sample-rate", "-8000"], "--sample-rate"), (["--reference-audio", "no-such-recording.wav"],
                                                    "--reference-audio"),
])
def test_a_bad_argument_is_refused_naming_its_flag(custom_voice_server: RunningServer, tmp_path: Path,
                                                   argv: list[str], flag: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        run(custom_voice_server, "say", "Hi.", "--speaker", "ryan", "-o", str(tmp_path / "x.wav"), *argv)
    assert exited.value.code == 2
    assert f"argument {flag}: " in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_timeout_of_zero_is_refused_naming_its_flag(custom_voice_server: RunningServer,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--server", custom_voice_server.target, "--timeout", "0", "voices"])
    assert exited.value.code == 2
    assert "argument --timeout: " in capsys.readouterr().err


def test_voice_commands_create_list_use_and_delete_a_registered_voice(base_server: RunningServer, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    reference = tmp_path / "me.wav"
    reference.write_bytes(wav_file(pcm16_samples(seed=0)))
    assert run(base_server, "voice", "create", "--reference-audio", str(reference),
               "--reference-text", REFERENCE_TEXT) == 0
    voice_id = capsys.readouterr().out.strip()
    assert run(base_server, "voice", "list") == 0
    listed = capsys.readouterr().out
    assert listed.startswith(f"{voice_id}  in_context  1.00 s  ") and repr(REFERENCE_TEXT) in listed
    output = tmp_path / "hello.wav"
    assert run(base_server, "say", "Hello.", "--voice-id", voice_id, "--temperature", "0", "-o", str(output)) == 0
    assert sf.info(str(output)).frames > 0
    assert run(base_server, "voice", "delete", voice_id) == 0
    capsys.readouterr()
    assert run(base_server, "voice", "get", voice_id) == 1
    assert f"NOT_FOUND: voice_id: no voice {voice_id!r}" in capsys.readouterr().err


def test_say_file_speaks_a_documents_text_and_reads_stdin_for_a_dash(custom_voice_server: RunningServer,
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    document = tmp_path / "chapter.txt"
    document.write_text("Chapter one.\nIt was a quiet night, and the sea was calm.\n", encoding="utf-8")
    from_file, from_stdin = tmp_path / "file.wav", tmp_path / "stdin.wav"
    assert run(custom_voice_server, "say", "--file", str(document), "--speaker", "ryan", "--temperature", "0",
               "-o", str(from_file)) == 0
    read_end, write_end = os.pipe()
    os.write(write_end, document.read_bytes())
    os.close(write_end)
    monkeypatch.setattr("sys.stdin", os.fdopen(read_end))
    assert run(custom_voice_server, "say", "--file", "-", "--speaker", "ryan", "--temperature", "0",
               "-o", str(from_stdin)) == 0
    assert from_file.read_bytes() == from_stdin.read_bytes() and from_file.stat().st_size > 44


@pytest.mark.parametrize(("content", "expected"), [(b"caf\xe9", "is not UTF-8 text"), (None, "cannot read")],
                         ids=["not-utf8", "missing"])
def test_a_document_that_cannot_be_read_is_refused_naming_the_flag(custom_voice_server: RunningServer,
                                                                   tmp_path: Path, content: bytes | None,
                                                                   expected: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    document = tmp_path / "doc.txt"
    if content is not None:
        document.write_bytes(content)
    with pytest.raises(SystemExit) as exited:
        run(custom_voice_server, "say", "--file", str(document), "-o", str(tmp_path / "x.wav"))
    assert exited.value.code == 2
    assert "argument --file: " in (err := capsys.readouterr().err) and expected in err


def test_the_progress_bar_shows_audio_against_the_texts_length_and_the_real_time_factor() -> None:
    from clients.qwen3_tts_client.cli import _RealTimeBar, _speech_seconds

    shown = io.StringIO()
    with _RealTimeBar(total=round(_speech_seconds("word " * 70), 1), unit="s", desc="audio", file=shown,
                      disable=False, mininterval=0, bar_format="{desc}: {n:.1f}/~{total:.0f} s{postfix}") as bar:
        bar.update(10.0)
    assert "audio: 10.0/~20 s" in shown.getvalue() and "rtf " in shown.getvalue()  # 280 letters at 14 a second
