"""The scheduler host-time benchmark runs the steady load it describes and reports it."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.scheduler_host import main, time_steps


def test_every_running_request_decodes_every_timed_step() -> None:
    timings = time_steps(num_running=12, num_steps=20)
    assert timings["num_decodes"] == 12
    assert all(timings[name] > 0 for name in ("schedule_ms", "result_ms", "update_ms"))


def test_the_report_names_its_command_and_sizes(tmp_path: Path) -> None:
    out = tmp_path / "scheduler_host.json"
    assert main(["--running", "4", "--steps", "3", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["command"] == f"python -m benchmarks.scheduler_host --running 4 --steps 3 --out {out}"
    assert (report["num_running"], report["num_steps"], report["num_decodes"]) == (4, 3, 4)
