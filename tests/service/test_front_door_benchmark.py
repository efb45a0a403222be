"""The front door's CPU benchmark: its stand-in engine paces frames as measured and ends each request as the engine
would, and the benchmark drives the real server in front of it and reports every call."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from benchmarks import front_door
from benchmarks.front_door import main
from benchmarks.paced_core import FRAME_STEP_MS, PacedEngine, step_seconds
from scheduler.request import FinishReason
from tts_service.engine import EngineProcess
from tts_service.engine.model_info import ModelInfo
from tts_service.engine.streams import RequestStream, SynthesisRequest
from tts_service.model.checkpoint import LoadedModel
from tts_service.model.prompts import SynthesisInput
from tts_service.runner.params import GenerationParams


@pytest.mark.parametrize("size", sorted(FRAME_STEP_MS))
def test_a_stand_in_step_lasts_the_measured_frame_step_and_between_row_counts_a_straight_line(size: str) -> None:
    table = FRAME_STEP_MS[size]
    assert [step_seconds(rows, size) for rows, _ in table] == pytest.approx([ms / 1e3 for _, ms in table])
    (_, at_8), (_, at_64) = table[1], table[2]
    assert step_seconds(36, size) == pytest.approx((at_8 + (at_64 - at_8) * 28 / 56) / 1e3)
    assert step_seconds(1000, size) == step_seconds(256, size)


def request(request_id: str, num_frames: int, is_text_open: bool = False) -> SynthesisRequest:
    return SynthesisRequest(request_id, SynthesisInput("Hello."), GenerationParams(max_new_frames=num_frames),
                            is_text_open=is_text_open)


def test_the_stand_in_gives_each_request_its_frames_then_its_summary_and_holds_open_text_until_it_closes(
        tiny_models: dict[str, LoadedModel]) -> None:
    async def run() -> None:
        engine = PacedEngine(ModelInfo.of(tiny_models["custom_voice"]), 100, RequestStream)
        engine.start()
        short, long, open_text = (await engine.submit(request("short", 2)), await engine.submit(request("long", 5)),
                                  await engine.submit(request("open", 1, is_text_open=True)))
        assert sum([chunk.num_frames async for chunk in short]) == 2
        assert sum([chunk.num_frames async for chunk in long]) == 5
        assert short.summary is not None and long.summary is not None
        assert (short.summary.finish_reason, long.summary.num_frames) == (FinishReason.LENGTH, 5)
        assert engine.occupancy().num_running == 1  # its frame made, the open request waits for its text's end
        engine.close_text("open")
        assert sum([chunk.num_frames async for chunk in open_text]) == 1
        assert engine.occupancy().num_running == 0
        await engine.stop()

    asyncio.run(run())


def test_a_paused_request_gets_no_frames_and_an_aborted_one_ends_aborted(tiny_models: dict[str, LoadedModel]) -> None:
    async def run() -> None:
        engine = PacedEngine(ModelInfo.of(tiny_models["custom_voice"]), 100, RequestStream)
        engine.start()
        stream = await engine.submit(request("paused", 1000))
        engine.set_output_paused("paused", True)
        await asyncio.sleep(0.05)
        num_unread = stream.num_unread_frames
        await asyncio.sleep(0.05)
        assert stream.num_unread_frames == num_unread
        engine.abort("paused")
        assert sum([chunk.num_frames async for chunk in stream]) == num_unread
        assert stream.summary is not None and stream.summary.finish_reason is FinishReason.ABORTED
        await engine.stop()

    asyncio.run(run())


def test_the_benchmark_drives_the_real_server_and_reports_its_cpu_for_every_call_words_included(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The command configures the process's logging as the server does; in the test process that would outlive the
    # test (and take pytest's own log capture with it).
    monkeypatch.setattr(front_door, "configure_logging", lambda level, log_format: None)
    out = tmp_path / "front-door.json"
    argv = ["--rates", "4w", "--duration", "3", "--server-flag=--aligner-model=random:tiny", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["command"] == "python -m benchmarks.front_door " + " ".join(argv)
    (row,) = report["results"]
    assert row["rate"] == "4w" and row["word_lag_ms"]["num_messages"] >= row["num_calls"]
    assert row["num_calls"] >= 3 and row["num_completed"] == row["num_calls"] and row["errors_by_status"] == {}
    assert row["front_door_cpu_s"] > 0 and row["core_cpu_s"] > 0 and row["audio_s"] > 0
    assert row["gc"]["num_collections"] > 0 and row["num_requests_with_underruns"] == 0
    held = row["held_objects"]
    assert held["num_samples"] > 0 and held["tracked_objects_per_call_in_flight"] > 0 and held["idle_tracked_objects"]


def test_a_core_whose_warm_up_fails_is_stopped_with_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(front_door, "configure_logging", lambda level, log_format: None)
    started: list[EngineProcess] = []
    start = EngineProcess.start

    async def start_and_keep(*args: object, **kwargs: object) -> EngineProcess:
        door = await start(*args, **kwargs)  # type: ignore[arg-type]
        started.append(door)
        return door

    async def failing_warm_up(self: EngineProcess) -> bool:
        raise RuntimeError("warm-up failed")

    monkeypatch.setattr(EngineProcess, "start", start_and_keep)
    monkeypatch.setattr(EngineProcess, "warm_up", failing_warm_up)
    with pytest.raises(RuntimeError, match="warm-up failed"):
        main(["--rates", "4", "--duration", "1", "--out", str(tmp_path / "front-door.json")])
    (door,) = started
    assert not door.is_alive
