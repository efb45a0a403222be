"""The REAL Pipecat and LiveKit ElevenLabs TTS plugins against a real server process (no mocks of the server): each
speaks a whole turn and an interrupted one through the ElevenLabs-compatible WebSocket route and gets audio and word
timings.

The plugins live in a virtual environment of their own (they pin protobuf and OpenTelemetry versions ours do not
allow) whose python QWEN3_TTS_AGENTS_PYTHON names; `.ci/run` builds it. The test is skipped without it, except in
CI (CI=true), where it fails."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.processes import ServerProcess, free_port, server_process

AGENTS_PYTHON = os.environ.get("QWEN3_TTS_AGENTS_PYTHON")
SCRIPT = Path(__file__).resolve().parents[1] / "agents" / "plugins.py"
KEY = "agents-key"

if AGENTS_PYTHON is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("QWEN3_TTS_AGENTS_PYTHON is not set: CI must run the voice-agent plugins (.ci/run builds "
                           "their virtual environment)")
    pytest.skip("QWEN3_TTS_AGENTS_PYTHON is not set: no virtual environment with pipecat-ai==1.14.0 and "
                "livekit-plugins-elevenlabs==1.8.9 to run the plugins from", allow_module_level=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int]]:
    http_port = free_port()
    # The tiny random aligner times every word (the timings are noise, but they are the aligner's, end to end).
    with server_process(tmp_path_factory.mktemp("agents"), "--http-port", str(http_port), "--max-audio-seconds",
                        "1.5", "--aligner-model", "random:tiny", env={"QWEN3_TTS_API_KEYS": KEY}) as running:
        yield running, http_port


@pytest.fixture(scope="module")
def runs(served: tuple[ServerProcess, int]) -> dict[tuple[str, str], dict]:
    running, http_port = served
    assert AGENTS_PYTHON is not None
    finished = subprocess.run([AGENTS_PYTHON, str(SCRIPT), "--base-url", f"ws://127.0.0.1:{http_port}",
                               "--api-key", KEY, "--voice", "ryan"], capture_output=True, text=True, timeout=300)
    results = [json.loads(line) for line in finished.stdout.splitlines() if line.startswith("{")]
    assert results, f"the plugins' script reported nothing:\n{finished.stderr[-4000:]}\n{running.log_tail()}"
    return {(result["plugin"], result["scenario"]): result for result in results}


# livekit-mp3: LiveKit's plugin left at its default encoding, MP3 frames, which it decodes itself.
@pytest.mark.parametrize("plugin", ["pipecat", "livekit", "livekit-mp3"])
@pytest.mark.parametrize("scenario", ["turn", "interrupt"])
def test_the_real_plugin_speaks_a_turn_with_audio_and_word_timings(runs: dict[tuple[str, str], dict], plugin: str,
                                                                    scenario: str) -> None:
    result = runs[(plugin, scenario)]
    assert result["errors"] == []
    assert result["audio_seconds"] > 0
    # Word timings come from the alignment the server sends with the audio (--aligner-model): one word each, where
    # without alignment Pipecat would fall back to whole sentences and LiveKit would time nothing.
    assert result["words"] and all(word["start_s"] is not None for word in result["words"])
    assert all(len(word["text"].split()) == 1 for word in result["words"])
