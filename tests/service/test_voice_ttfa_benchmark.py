"""The voice-id benchmark runs end to end against a real server on the tiny Base model, so that its H100 run is one
command away (the figures themselves come from the GPU, never from here)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import voice_ttfa
from tests.service.helpers import start_server
from tts_service.model.checkpoint import LoadedModel


def test_the_voice_ttfa_benchmark_times_both_ways_and_cleans_up(tiny_models: dict[str, LoadedModel],
                                                                 tmp_path: Path) -> None:
    server = start_server(tiny_models["base"])
    try:
        out = tmp_path / "voice_ttfa.json"
        assert voice_ttfa.main(["--server", server.target, "--iterations", "2", "--reference-seconds", "1",
                                "--max-audio-seconds", "0.16", "--out", str(out)]) == 0
        report = json.loads(out.read_text())
        assert set(report["ttfa"]) == {"by_voice_id", "reference_audio_inline"}
        assert all(mode["num_requests"] == 2 and mode["p50_ms"] > 0 for mode in report["ttfa"].values())
        assert report["create_voice_ms"] > 0 and report["model"]
        with server.client() as client:
            assert not client.list_voices().registered_voices  # the benchmark deleted its voice
    finally:
        server.stop()
