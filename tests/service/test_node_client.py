"""The Node.js client (clients/node) against the real server, run as its own process.

One server process (`python -m tts_service --model random:tiny-custom_voice --aligner-model random:tiny`, on
the CPU, with an API key) serves the module; every test runs the Node CLI, `node clients/node/bin/qwen3-tts.js`, in
a subprocess, as a user would. Needs `node` on PATH (skipped otherwise); installs the client's
packages with `npm ci` when clients/node/node_modules is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import soundfile

from tests.service.processes import ROOT, ServerProcess, server_process
from tests.service.test_voice_clone import pcm16_samples, wav_file
from tts_service.model.aligner_text import split_words

NODE_PACKAGE = ROOT / "clients" / "node"
CLI = NODE_PACKAGE / "bin" / "qwen3-tts.js"
API_KEY = "node-client-test-key"
# Short utterances keep the module fast on a small CPU: the random model never stops on its own.
MAX_AUDIO_SECONDS = 2.0
SAMPLES_PER_FRAME_24K = 1920
CLI_TIMEOUT_S = 90.0
SUMMARY = re.compile(r"wrote (?P<output>.+?): (?P<seconds>[0-9.]+) s of audio \((?P<encoding>\w+), (?P<rate>\d+) Hz\)"
                     r".* finish reason (?P<reason>\w+)")


@pytest.fixture(scope="module")
def node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH: the Node.js client cannot run here")
    if not (NODE_PACKAGE / "node_modules" / "@grpc" / "grpc-js").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm is not on PATH and clients/node/node_modules is missing")
        install = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_PACKAGE, capture_output=True,
                                 text=True, timeout=600)
        assert install.returncode == 0, f"npm ci failed in {NODE_PACKAGE}:\n{install.stdout}\n{install.stderr}"
    return node


@pytest.fixture(scope="module")
def server(node: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("node-client-server")
    keys = directory / "api-keys"
    keys.write_text(f"# the test's key\n{API_KEY}\n")
    # The random aligner times words (as noise) for the tests of word timestamps; calls without them never use it.
    with server_process(directory, "--api-keys-file", str(keys), "--max-audio-seconds", str(MAX_AUDIO_SECONDS),
                        "--drain-timeout-seconds", "2", "--aligner-model", "random:tiny") as running:
        yield running


def cli_args(server: ServerProcess, *args: str, api_key: str | None = API_KEY) -> list[str]:
    return ["--server", server.target, *(["--api-key", api_key] if api_key else []), *args]


def run_cli(node: str, server: ServerProcess, *args: str,
            api_key: str | None = API_KEY) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name != "QWEN3_TTS_API_KEY"}
    return subprocess.run([node, str(CLI), *cli_args(server, *args, api_key=api_key)], capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S, env=env)


def summary(stderr: str) -> re.Match[str]:
    match = SUMMARY.search(stderr)
    assert match, f"no summary line in the CLI's stderr:\n{stderr}"
    return match


def test_node_sources_parse_and_the_offline_unit_tests_pass(node: str) -> None:
    sources = sorted(str(path) for folder in ("src", "bin", "examples", "test")
                     for path in (NODE_PACKAGE / folder).glob("*.js"))
    assert sources
    for source in sources:
        check = subprocess.run([node, "--check", source], capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stderr
    unit = subprocess.run([node, "--test", "test/offline.test.js"], cwd=NODE_PACKAGE, capture_output=True, text=True,
                          timeout=120)
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_voices_lists_the_loaded_models_speakers(node: str, server: ServerProcess) -> None:
    result = run_cli(node, server, "voices", "--json")
    assert result.returncode == 0, result.stderr
    voices = json.loads(result.stdout)
    assert voices["mode"] == "MODEL_MODE_CUSTOM_VOICE"
    assert voices["random_weights"] is True
    assert "ryan" in [speaker["name"] for speaker in voices["speakers"]]
    assert "AUDIO_ENCODING_PCM16" in [support["encoding"] for support in voices["output_formats"]]


def test_stream_speaks_stdin_fragments_before_stdin_closes_and_writes_a_complete_wav(
        node: str, server: ServerProcess, tmp_path: Path) -> None:
    output = tmp_path / "streamed.wav"
    process = subprocess.Popen(
        [node, str(CLI), *cli_args(server, "stream", "-o", str(output), "--speaker", "ryan", "--language", "english")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdin is not None
    try:
        # Fragments split inside words, each sent on its own as soon as it is written.
        for fragment in ("Hel", "lo wor", "ld, this is a str"):
            process.stdin.write(fragment.encode())
            process.stdin.flush()
            time.sleep(0.1)
        # Audio reaches the file while stdin is still open: the CLI sent the text as it arrived,
        # and writes the audio as it arrives.
        deadline = time.monotonic() + 60
        while not (output.exists() and output.stat().st_size > 44):
            assert process.poll() is None, process.communicate()[1].decode()
            assert time.monotonic() < deadline, "no audio while the text was still open"
            time.sleep(0.05)
        for fragment in ("eaming te", "st."):
            process.stdin.write(fragment.encode())
            process.stdin.flush()
            time.sleep(0.1)
        _, stderr_bytes = process.communicate(timeout=CLI_TIMEOUT_S)  # closes stdin: the end of the text
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stderr = stderr_bytes.decode()
    assert process.returncode == 0, stderr

    result = summary(stderr)
    audio, rate = soundfile.read(output, dtype="int16")
    assert rate == 24000
    assert result["encoding"] == "wav"
    assert result["reason"] in ("stopped", "length")
    assert 0 < len(audio) <= MAX_AUDIO_SECONDS * rate
    assert len(audio) % SAMPLES_PER_FRAME_24K == 0
    assert len(audio) == round(float(result["seconds"]) * rate)
    # The streamed header's "unknown" sizes were replaced by the real ones.
    data = output.read_bytes()
    assert int.from_bytes(data[4:8], "little") == len(data) - 8
    assert data.find(b"data") > 0
    assert int.from_bytes(data[data.find(b"data") + 4:data.find(b"data") + 8], "little") == len(audio) * 2


def test_library_streams_tokens_with_a_flush_and_iterates_contiguous_audio_to_the_completion(
        node: str, server: ServerProcess) -> None:
    env = {**os.environ, "QWEN3_TTS_API_KEY": API_KEY}
    result = subprocess.run([node, str(NODE_PACKAGE / "examples" / "stream-tokens.js"), server.target, "ryan"],
                            capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env)
    assert result.returncode == 0, result.stderr
    streamed = json.loads(result.stdout)
    assert streamed["flushAcks"] == ["after-this"]
    assert streamed["chunks"] > 0
    assert streamed["contiguous"]
    assert streamed["bytes"] == streamed["samples"] * 2  # PCM16: two bytes a sample
    completion = streamed["completion"]
    assert completion["finish_reason"] in ("FINISH_REASON_STOPPED", "FINISH_REASON_LENGTH")
    assert streamed["samples"] == round(completion["usage"]["audio_seconds"] * 16000)
    assert streamed["requestId"] == completion["request_id"] != ""


def words_of(text: str) -> list[tuple[str, int, int]]:
    return [(word.text, word.start_char, word.end_char) for word in split_words(text)]


def printed_words(stderr: str) -> list[tuple[str, int, int]]:
    """(word, start_char, end_char) from the CLI's 'word 0.240-0.560 s: Hello [0:5]' lines."""
    words = []
    for line in stderr.splitlines():
        if line.startswith("word "):
            word, span = line.split(": ", 1)[1].rsplit(" ", 1)
            start, end = span.strip("[]").split(":")
            words.append((word, int(start), int(end)))
    return words


def test_library_speaks_turns_as_utterances_of_one_call_cancels_one_and_times_the_words_of_each(
        node: str, server: ServerProcess) -> None:
    env = {**os.environ, "QWEN3_TTS_API_KEY": API_KEY}
    result = subprocess.run([node, str(NODE_PACKAGE / "examples" / "utterances.js"), server.target, "ryan"],
                            capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env)
    assert result.returncode == 0, result.stderr
    heard = json.loads(result.stdout)
    assert list(heard) == ["t1", "t2", "t3"]
    cut = heard["t2"]
    assert cut["finishReason"] == "cancelled"
    assert 0 < cut["samples"] < MAX_AUDIO_SECONDS * 16000  # stopped after its first audio
    # Only words committed before the cancel, so at most the first few, in order.
    assert [(w["word"], w["start_char"], w["end_char"]) for w in cut["words"]] == words_of(cut["text"])[
        :len(cut["words"])]
    for spoken in (heard["t1"], heard["t3"]):  # t3 spoken on the same call, after the cancel
        assert spoken["finishReason"] in ("stopped", "length")
        assert spoken["contiguous"] and spoken["samples"] == round(spoken["audioSeconds"] * 16000)
        assert [(w["word"], w["start_char"], w["end_char"]) for w in spoken["words"]] == words_of(spoken["text"])
        assert all(0 <= w["start_seconds"] <= w["end_seconds"] <= spoken["audioSeconds"] + 1e-6
                   for w in spoken["words"])


@pytest.mark.parametrize("call", ["streamed", "unary"])
def test_say_with_timestamps_prints_every_word_to_stderr_and_the_same_audio(node: str, server: ServerProcess,
                                                                             tmp_path: Path, call: str) -> None:
    text = "Hello there, friend. How are you?"
    plain, timed = tmp_path / "plain.pcm", tmp_path / "timed.pcm"
    common = ["--speaker", "ryan", "--encoding", "pcm16", "--temperature", "0",
              *(["--unary"] if call == "unary" else [])]
    without = run_cli(node, server, "say", text, "-o", str(plain), *common)
    result = run_cli(node, server, "say", text, "-o", str(timed), "--timestamps", *common)
    assert without.returncode == 0 and result.returncode == 0, without.stderr + result.stderr
    assert printed_words(result.stderr) == words_of(text)
    assert printed_words(without.stderr) == []  # callers that do not ask get what they got before
    assert timed.read_bytes() == plain.read_bytes()


def test_stream_with_timestamps_prints_the_words_of_stdin(node: str, server: ServerProcess, tmp_path: Path) -> None:
    text = "Hi there. Bye now."
    result = subprocess.run([node, str(CLI), *cli_args(server, "stream", "-o", str(tmp_path / "s.wav"), "--speaker",
                                                       "ryan", "--timestamps")],
                            input=text, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert printed_words(result.stderr) == words_of(text)


@pytest.mark.parametrize("call", ["streamed", "unary"])
def test_say_writes_headerless_pcm16_at_the_requested_rate(node: str, server: ServerProcess, tmp_path: Path,
                                                           call: str) -> None:
    output = tmp_path / "said.pcm"
    result = run_cli(node, server, "say", "Hello from Node.", "-o", str(output), "--speaker", "ryan",
                     "--encoding", "pcm16", "--sample-rate", "16000", "--max-seconds", "0.8", "--seed", "7",
                     *(["--unary"] if call == "unary" else []))
    assert result.returncode == 0, result.stderr
    said = summary(result.stderr)
    assert (said["encoding"], said["rate"]) == ("pcm16", "16000")
    size = output.stat().st_size
    assert size > 0
    assert size % 2 == 0
    assert size == round(float(said["seconds"]) * 16000) * 2
    assert not output.read_bytes().startswith(b"RIFF")


def test_unknown_speaker_makes_say_exit_nonzero_with_invalid_argument(node: str, server: ServerProcess,
                                                                       tmp_path: Path) -> None:
    output = tmp_path / "nobody.wav"
    result = run_cli(node, server, "say", "Hello.", "-o", str(output), "--speaker", "nobody")
    assert result.returncode != 0
    assert "INVALID_ARGUMENT" in result.stderr
    assert "nobody" in result.stderr
    assert not output.exists()


def test_unknown_speaker_ends_stream_with_invalid_argument_while_stdin_is_still_open(
        node: str, server: ServerProcess, tmp_path: Path) -> None:
    output = tmp_path / "nobody-stream.wav"
    process = subprocess.Popen(
        [node, str(CLI), *cli_args(server, "stream", "-o", str(output), "--speaker", "nobody")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdin is not None and process.stderr is not None
    try:
        process.stdin.write(b"Hello the")
        process.stdin.flush()
        returncode = process.wait(timeout=CLI_TIMEOUT_S)  # stdin never closed: the error alone ends the CLI
        stderr = process.stderr.read().decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdin.close()
    assert returncode != 0
    assert "INVALID_ARGUMENT" in stderr
    assert not output.exists()


def test_missing_api_key_makes_the_cli_exit_nonzero_with_unauthenticated(node: str, server: ServerProcess,
                                                                          tmp_path: Path) -> None:
    result = run_cli(node, server, "say", "Hello.", "-o", str(tmp_path / "denied.wav"), "--speaker", "ryan",
                     api_key=None)
    assert result.returncode != 0
    assert "UNAUTHENTICATED" in result.stderr


def test_the_voice_commands_clone_once_speak_by_id_and_forget(node: str, tmp_path: Path) -> None:
    keys = tmp_path / "api-keys"
    keys.write_text(f"{API_KEY}\n")
    reference = tmp_path / "me.wav"
    reference.write_bytes(wav_file(pcm16_samples(seed=4, seconds=1.0)))
    with server_process(tmp_path, "--api-keys-file", str(keys), "--max-audio-seconds", str(MAX_AUDIO_SECONDS),
                        model="random:tiny-base") as base:
        created = run_cli(node, base, "voice", "create", "--reference-audio", str(reference), "--x-vector-only")
        assert created.returncode == 0, created.stderr
        voice_id = created.stdout.strip()
        listed = run_cli(node, base, "voice", "list")
        assert listed.returncode == 0 and listed.stdout.startswith(f"{voice_id}\tx_vector\t1.00 s"), listed.stdout
        output = tmp_path / "mine.wav"
        spoken = run_cli(node, base, "say", "In my voice.", "-o", str(output), "--voice-id", voice_id,
                         "--max-seconds", "0.32")
        assert spoken.returncode == 0, spoken.stderr
        assert soundfile.info(str(output)).frames == 4 * SAMPLES_PER_FRAME_24K
        got = run_cli(node, base, "voice", "get", voice_id, "--json")
        assert got.returncode == 0 and json.loads(got.stdout)["kind"] == "VOICE_KIND_X_VECTOR"
        assert run_cli(node, base, "voice", "delete", voice_id).returncode == 0
        gone = run_cli(node, base, "voice", "get", voice_id)
        assert gone.returncode == 1 and "NOT_FOUND" in gone.stderr
