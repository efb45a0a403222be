"""The load generator: its schedule, its underrun arithmetic, and a short run against a real server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.loadgen.__main__ import main as loadgen_main
from clients.loadgen.report import percentile
from clients.loadgen.schedule import poisson_schedule
from observability.playback import ChunkArrival, underruns
from tests.service.helpers import RunningServer


def test_the_poisson_schedule_is_seeded_and_open_loop() -> None:
    first, again = poisson_schedule(20, 10, "mixed", seed=3), poisson_schedule(20, 10, "mixed", seed=3)
    assert first == again and first != poisson_schedule(20, 10, "mixed", seed=4)
    assert 120 < len(first) < 280  # 200 expected; a Poisson count this far out is a broken sampler
    starts = [request.start_s for request in first]
    assert starts == sorted(starts) and starts[0] > 0 and starts[-1] < 10
    assert {request.rpc for request in first} == {"online", "streaming"}


def test_a_chunk_is_late_by_how_long_after_its_playback_time_it_arrived() -> None:
    # Playback starts at t=1.0 with the chunk at offset 0; the chunk at 0.5 s is due at 1.5.
    on_time = [ChunkArrival(1.0, 0.0), ChunkArrival(1.4, 0.5), ChunkArrival(1.9, 1.0)]
    assert underruns(on_time).num_late_chunks == 0
    late = underruns([ChunkArrival(1.0, 0.0), ChunkArrival(1.7, 0.5), ChunkArrival(2.3, 1.0)])
    assert late.num_late_chunks == 2
    assert late.total_s == pytest.approx(0.2 + 0.3) and late.max_s == pytest.approx(0.3)
    assert underruns([]).num_late_chunks == 0


def test_percentile_is_nearest_rank() -> None:
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert percentile([1.0, 2.0], 0.95) == 2.0 and percentile([], 0.5) is None


def run_loadgen(server: RunningServer, out: Path, *extra: str) -> dict:
    assert loadgen_main(["--server", server.target, "--rate", "3", "--duration", "2.5", "--max-audio-seconds", "0.4",
                         "--seed", "5", "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_a_short_open_loop_run_completes_every_scheduled_request(custom_voice_server: RunningServer,
                                                                  tmp_path: Path) -> None:
    report = run_loadgen(custom_voice_server, tmp_path / "load.json", "--rpc", "mixed")
    requests, summary = report["requests"], report["summary"]
    assert len(requests) == len(report["schedule"]) == summary["num_requests"] > 0
    assert summary["num_completed"] == len(requests) and summary["errors_by_status"] == {}
    for record in requests:
        assert 0 < record["time_to_first_audio_s"] < record["end_to_end_s"]
        assert record["audio_s"] > 0 and record["num_chunks"] >= 1 and record["finish_reason"] == "length"
    assert {record["rpc"] for record in requests} <= {"online", "streaming"}
    assert summary["ttfa_ms"]["p50"] > 0 and summary["audio_s_per_wall_s"] > 0


def test_refused_requests_are_counted_by_status(custom_voice_server: RunningServer, tmp_path: Path) -> None:
    # SynthesizeOnline only: grpcio's asyncio client can report a refused bidirectional call as
    # INTERNAL "Internal error from Core" when its own writes race the server's status (grpc#36066).
    report = run_loadgen(custom_voice_server, tmp_path / "refused.json", "--rpc", "online", "--speaker", "nobody")
    summary = report["summary"]
    assert summary["num_completed"] == 0
    assert summary["errors_by_status"] == {"INVALID_ARGUMENT": summary["num_requests"]}
    assert all(record["time_to_first_audio_s"] is None for record in report["requests"])
