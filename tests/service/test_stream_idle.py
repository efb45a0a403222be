"""The stream-idle benchmark's arithmetic: busy and idle time per stream and for the whole device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.stream_idle import Activity, device_activities, idle_by_stream


def test_overlapping_activities_count_once_and_idle_time_is_what_the_window_leaves() -> None:
    # Stream 7: 0-100 and 50-150 overlap (busy 150), then 400-500; stream 9: 120-300. Window 0-1000, 4 steps.
    activities = [Activity(7, 0, 100, "talker"), Activity(7, 50, 150, "talker"), Activity(7, 400, 500, "sampling"),
                  Activity(9, 120, 300, "codec")]
    report = idle_by_stream(activities, (0.0, 1000.0), num_steps=4)
    main, codec = report["streams"]["7"], report["streams"]["9"]
    assert main["busy_ms"] == pytest.approx(0.25) and main["idle_ms"] == pytest.approx(0.75)
    assert main["idle_ms_per_step"] == pytest.approx(0.75 / 4)
    # Gaps: 150-400 and 500-1000; none at the window's start, where stream 7 is busy.
    assert main["num_gaps_over_50us"] == 2 and main["longest_gap_ms"] == pytest.approx(0.5)
    assert codec["busy_ms"] == pytest.approx(0.18) and codec["top_activities_ms"] == {"codec": pytest.approx(0.18)}
    # The device is busy 0-300 and 400-500.
    assert report["device"]["busy_ms"] == pytest.approx(0.4) and report["device"]["num_gaps_over_50us"] == 2


def test_activities_are_clipped_to_the_window_and_short_gaps_are_not_counted() -> None:
    activities = [Activity(1, -50, 50, "a"), Activity(1, 80, 200, "b"), Activity(1, 950, 1100, "c")]
    report = idle_by_stream(activities, (0.0, 1000.0), num_steps=1)
    stream = report["streams"]["1"]
    assert stream["busy_ms"] == pytest.approx(0.22)
    # 50-80 is shorter than 50 us; 200-950 is the one long gap.
    assert stream["num_gaps_over_50us"] == 1 and stream["gaps_over_50us_ms"] == pytest.approx(0.75)


def test_the_device_activities_of_a_chrome_trace_are_its_kernels_copies_and_memsets(tmp_path: Path) -> None:
    trace = {"traceEvents": [
        {"cat": "kernel", "name": "gemv", "ts": 10.0, "dur": 5.0, "args": {"stream": 7}},
        {"cat": "gpu_memcpy", "name": "Memcpy DtoH", "ts": 20.0, "dur": 2.0, "args": {"stream": 7}},
        {"cat": "gpu_memset", "name": "Memset", "ts": 30.0, "dur": 1.0, "args": {"stream": 9}},
        {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 5.0, "dur": 3.0, "args": {}},
        {"ph": "M", "name": "process_name", "args": {"name": "python"}},
    ]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    assert device_activities(path) == [Activity(7, 10.0, 15.0, "gemv"), Activity(7, 20.0, 22.0, "Memcpy DtoH"),
                                       Activity(9, 30.0, 31.0, "Memset")]
