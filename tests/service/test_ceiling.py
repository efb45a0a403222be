"""The gRPC-against-in-process comparison behind issue 14's 90% target (benchmarks/ceiling.py), on made-up reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.ceiling import compare, load_levels
from clients.loadgen.__main__ import write_report


def closed_loop_report(concurrency: int, audio_s_per_s: float, num_requests: int = 64) -> dict:
    return {"settings": {"concurrency": concurrency, "num_requests": num_requests},
            "summary": {"audio_s_per_wall_s": audio_s_per_s, "errors_by_status": {"UNAVAILABLE": 1},
                        "num_requests_with_underruns": 0, "ttfa_ms": {"p50": 30.0, "p95": 40.0}}}


def engine_report(levels: dict[int, float], num_requests: int = 64, workload: str = "loadgen") -> dict:
    return {"workload": workload, "levels": [
        {"concurrency": concurrency, "num_requests": num_requests, "audio_s_per_wall_s": audio_s_per_s,
         "num_requests_late": 0} for concurrency, audio_s_per_s in levels.items()]}


def test_each_concurrency_gets_the_grpc_share_of_the_in_process_audio_and_the_90_percent_verdict() -> None:
    rows = compare({32: closed_loop_report(32, 200.0), 128: closed_loop_report(128, 350.0)},
                   engine_report({32: 210.0, 128: 400.0}))
    assert [row["concurrency"] for row in rows] == [32, 128]
    assert rows[0]["grpc_share"] == pytest.approx(200 / 210) and rows[0]["is_target_met"]
    assert rows[1]["grpc_share"] == pytest.approx(0.875) and not rows[1]["is_target_met"]
    assert rows[0]["grpc_errors"] == 1


@pytest.mark.parametrize(("grpc", "engine", "message"), [
    ({32: closed_loop_report(32, 1.0)}, engine_report({32: 1.0, 128: 1.0}), "concurrencies differ"),
    ({32: closed_loop_report(32, 1.0)}, engine_report({32: 1.0}, workload="bench"), "--workload loadgen"),
    ({32: closed_loop_report(32, 1.0, num_requests=64)}, engine_report({32: 1.0}, num_requests=128), "64 and 128"),
])
def test_runs_that_did_not_send_the_same_requests_are_not_compared(grpc: dict, engine: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compare(grpc, engine)


def test_the_reports_are_found_by_their_concurrency_and_the_warm_up_is_left_out(tmp_path: Path) -> None:
    write_report(tmp_path / "loadgen-c32.json.gz", closed_loop_report(32, 1.0))
    write_report(tmp_path / "loadgen-c128.json", closed_loop_report(128, 2.0))
    write_report(tmp_path / "warmup.json.gz", closed_loop_report(8, 3.0))
    assert sorted(load_levels(tmp_path)) == [32, 128]
    write_report(tmp_path / "loadgen-c64.json.gz", closed_loop_report(16, 1.0))
    with pytest.raises(ValueError, match="at 16 in flight, not 64"):
        load_levels(tmp_path)
    with pytest.raises(ValueError, match="no loadgen"):
        load_levels(tmp_path / "empty")
