"""An engine in the server's own process (--no-engine-process), which nothing watches from outside, bounds its own
steps: a runner call that lasts the stall timeout ends the engine (EngineStalledError), its live requests end with an
error, every thread's stack (the stuck one's naming its call) goes to stderr, and stopping it does not wait for the
stuck thread. The server's process then ends without waiting for that thread either."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from scheduler.request import FinishReason
from tests.engine.test_engine import TEXTS, make_engine
from tts_service.api import main as server_main
from tts_service.engine import engine as engine_module
from tts_service.engine.engine import RUNNER_THREAD_NAME, EngineStalledError
from tts_service.engine.streams import RequestFailed, SynthesisRequest
from tts_service.model.prompts import SynthesisInput
from tts_service.runner.params import GenerationParams

STALL_TIMEOUT_S = 1.0
MARGIN_S = 2.0


@pytest.fixture
def step_that_never_returns(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Every runner step blocks until the event is set (set at the end, so the stuck thread ends with the test)."""
    release = threading.Event()

    def stuck_step(*args: object, **kwargs: object) -> None:
        release.wait()

    monkeypatch.setattr(engine_module, "run_step", stuck_step)
    monkeypatch.setattr(engine_module, "start_frames", stuck_step)
    yield release
    release.set()


def test_a_step_that_never_returns_ends_the_engine_and_its_requests_and_stop_does_not_wait_for_it(
        tiny_models: dict, step_that_never_returns: threading.Event, capfd: pytest.CaptureFixture[str]) -> None:
    async def run() -> tuple[float, float]:
        engine = make_engine(tiny_models["custom_voice"])
        engine.start(stall_timeout_s=STALL_TIMEOUT_S)
        started = time.monotonic()
        stream = await engine.submit(SynthesisRequest("stuck", SynthesisInput(TEXTS[0], "english", "ryan"),
                                                      GenerationParams(max_new_frames=8)))
        with pytest.raises(RequestFailed):
            await asyncio.wait_for(stream.collect(), STALL_TIMEOUT_S + MARGIN_S)
        ended_s = time.monotonic() - started
        with pytest.raises(EngineStalledError):
            await engine.join()
        assert engine.is_stalled and not engine.is_running
        stop_started = time.monotonic()
        await asyncio.wait_for(engine.stop(), MARGIN_S)
        return ended_s, time.monotonic() - stop_started

    ended_s, stop_s = asyncio.run(run())
    assert STALL_TIMEOUT_S * 0.9 <= ended_s < STALL_TIMEOUT_S + MARGIN_S
    assert stop_s < MARGIN_S
    assert "in stuck_step" in capfd.readouterr().err


def test_without_a_bound_a_long_step_is_waited_for(tiny_models: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine core's engine has no bound of its own (its server watches it): a slow step just takes its time."""
    original = engine_module.run_step

    def slow_step(*args: object, **kwargs: object) -> object:
        time.sleep(STALL_TIMEOUT_S * 1.5)
        return original(*args, **kwargs)

    monkeypatch.setattr(engine_module, "run_step", slow_step)

    async def run() -> tuple[FinishReason, bool]:
        engine = make_engine(tiny_models["custom_voice"], chunk_schedule=(2,))
        engine.start()
        stream = await engine.submit(SynthesisRequest("slow", SynthesisInput(TEXTS[1], "english", "ryan"),
                                                      GenerationParams(max_new_frames=2)))
        _, summary = await stream.collect()
        await engine.stop()
        return summary.finish_reason, engine.is_stalled

    assert asyncio.run(run()) in ((FinishReason.LENGTH, False), (FinishReason.STOPPED, False))


def runner_thread_stuck_until(release: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=release.wait, name=f"{RUNNER_THREAD_NAME}_0")
    thread.start()
    return thread


@pytest.mark.parametrize("is_stuck", [True, False])
def test_a_failing_server_ends_its_process_at_once_only_when_a_runner_thread_is_stuck(
        monkeypatch: pytest.MonkeyPatch, is_stuck: bool) -> None:
    exits: list[int] = []
    monkeypatch.setattr(server_main.os, "_exit", exits.append)
    release = threading.Event()
    thread = runner_thread_stuck_until(release) if is_stuck else None
    # Only this test's threads: other tests' engines may still have runner threads winding down.
    monkeypatch.setattr(server_main.threading, "enumerate",
                        lambda: [threading.main_thread(), *([thread] if thread is not None else [])])
    try:
        server_main.exit_past_a_stuck_runner(1)
    finally:
        release.set()
        if thread is not None:
            thread.join()
    assert exits == ([1] if is_stuck else [])


