"""Several engine cores behind one door (EngineCores, `--device cuda:0,cuda:1`), here two cores on the CPU: requests
are placed by load and make what one core makes, what follows a request finds its core, registered voices are
spoken by every core, and a core that dies fails only its own requests, then starts again (or is left down)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from tts_service.engine import (
    CoreSpec,
    EngineConfig,
    EngineCoreLost,
    EngineCores,
    EngineOccupancy,
    EngineProcess,
    EngineStoppedError,
    FinishReason,
    GenerationParams,
    SamplingParams,
    SynthesisInput,
    SynthesisRequest,
    SynthesisSummary,
    cores,
)
from tts_service.engine.cores import core_specs

T = TypeVar("T")
CONFIG = EngineConfig(max_running=4, max_waiting=8, max_positions_per_request=512)
TEXT = "Two cores, one door."
SEEDED = GenerationParams(talker=SamplingParams(0.9, top_k=50), predictor=SamplingParams(0.9, top_k=50),
                          max_new_frames=10, min_new_frames=10, seed=7)
LONG = GenerationParams(max_new_frames=400, min_new_frames=400)


class SaysWhenWarm(EngineProcess):
    on_warm: Callable[[], Awaitable[None]] | None = None

    async def warm_up(self) -> bool:
        is_warm = await super().warm_up()
        if self.on_warm is not None:
            await self.on_warm()
        return is_warm


class StartedCores:
    """Starts cores as EngineCores asks, keeping each process it started (in the order they came up), and saying
    when n have warmed up: the door warms up a core it starts again before it places requests on it."""

    def __init__(self) -> None:
        self.processes: list[EngineProcess] = []
        self._num_warm = 0
        self._warmed = asyncio.Condition()

    async def __call__(self, spec: CoreSpec) -> EngineProcess:
        process = await SaysWhenWarm.start(spec)
        assert isinstance(process, SaysWhenWarm)
        process.on_warm = self._say_warm
        self.processes.append(process)
        return process

    async def _say_warm(self) -> None:
        async with self._warmed:
            self._num_warm += 1
            self._warmed.notify_all()

    async def wait_for_warm_ups(self, count: int) -> None:
        async with self._warmed:
            await self._warmed.wait_for(lambda: self._num_warm >= count)


def specs(checkpoint: Path, config: EngineConfig = CONFIG) -> list[CoreSpec]:
    spec = CoreSpec(str(checkpoint), "cpu", config, "WARNING", "text", 0.005, 30.0)
    return [dataclasses.replace(spec, device="cpu") for spec in core_specs(spec, ["cuda:0", "cuda:1"])]


def with_cores(checkpoint: Path, body: Callable[[EngineCores, StartedCores], Awaitable[T]],
               config: EngineConfig = CONFIG) -> T:
    async def run() -> T:
        started = StartedCores()
        door = await EngineCores.start(specs(checkpoint, config), started)
        try:
            return await asyncio.wait_for(body(door, started), 120)
        finally:
            await door.stop()

    return asyncio.run(run())


def request(request_id: str, params: GenerationParams = SEEDED, **changes: object) -> SynthesisRequest:
    return SynthesisRequest(request_id, SynthesisInput(TEXT, "english", "ryan"), params, **changes)  # type: ignore[arg-type]


async def synthesize(door: EngineCores | EngineProcess, item: SynthesisRequest) -> SynthesisSummary:
    stream = await door.submit(item)
    _, summary = await stream.collect()
    return summary


def test_requests_are_spread_over_the_cores_by_load_and_make_what_one_core_makes(
        tiny_checkpoints: dict[str, Path]) -> None:
    async def four_at_once(door: EngineCores, started: StartedCores) -> tuple[list[list[str]], list[np.ndarray]]:
        # Each placement is made before the submit's first wait, in the order given.
        streams = await asyncio.gather(*(door.submit(request(name)) for name in "abcd"))
        placed = [[name for name in "abcd" if process.holds(name)] for process in started.processes]
        summaries = [(await stream.collect())[1] for stream in streams]
        assert door.occupancy().num_running == 0 and door.num_cores_running == 2
        return placed, [summary.codes for summary in summaries]

    placed, codes = with_cores(tiny_checkpoints["custom_voice"], four_at_once)
    assert sorted(placed) == [["a", "c"], ["b", "d"]]

    async def alone() -> np.ndarray:
        process = await EngineProcess.start(specs(tiny_checkpoints["custom_voice"])[0])
        try:
            return (await synthesize(process, request("a"))).codes
        finally:
            await process.stop()

    expected = asyncio.run(alone())
    for made in codes:  # one seed, one text: the same codes whichever core made them
        np.testing.assert_array_equal(made, expected)


def test_text_and_a_cancel_reach_the_core_that_holds_the_request(tiny_checkpoints: dict[str, Path]) -> None:
    async def open_texts(door: EngineCores, started: StartedCores) -> tuple[SynthesisSummary, SynthesisSummary]:
        open_input = SynthesisInput("", "english", "ryan")
        cancelled = await door.submit(SynthesisRequest("cancelled", open_input, LONG, is_text_open=True))
        spoken = await door.submit(SynthesisRequest("spoken", open_input, SEEDED, is_text_open=True))
        assert [process.holds("cancelled") for process in started.processes] == [
            not process.holds("spoken") for process in started.processes]
        door.append_text("spoken", "Text that arrives ")
        door.append_text("cancelled", "A text that is cut off before it ends. " * 4)
        door.append_text("spoken", "in pieces.")
        door.close_text("spoken")
        await anext(cancelled)
        door.abort("cancelled")
        return (await cancelled.collect())[1], (await spoken.collect())[1]

    cancelled, spoken = with_cores(tiny_checkpoints["custom_voice"], open_texts)
    assert cancelled.finish_reason is FinishReason.ABORTED
    assert spoken.finish_reason is FinishReason.LENGTH and spoken.num_frames == 10


def test_a_registered_voice_is_kept_by_the_first_core_and_spoken_by_every_core(
        tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    wav = np.sin(np.linspace(0, 400, 24000 * 2)).astype(np.float32) * 0.3
    config = dataclasses.replace(CONFIG, voice_store_dir=tmp_path / "voices")

    async def register_then_speak(door: EngineCores, started: StartedCores) -> list[SynthesisSummary]:
        voice = await door.create_voice(wav, None, True, "owner")
        found = await door.registered_voice(voice.voice_id, "owner")
        assert [listed.voice_id for listed in await door.registered_voices("owner")] == [voice.voice_id]
        synthesis = SynthesisInput(TEXT, "english", clone=found.clone)
        summaries = await asyncio.gather(*(synthesize(door, SynthesisRequest(name, synthesis, SEEDED))
                                           for name in ("on-first", "on-second")))
        await door.delete_voice(voice.voice_id, "owner")
        assert await door.registered_voices("owner") == []
        return list(summaries)

    first, second = with_cores(tiny_checkpoints["base"], register_then_speak, config)
    assert first.finish_reason is second.finish_reason is FinishReason.LENGTH
    np.testing.assert_array_equal(first.codes, second.codes)


def test_only_the_first_core_is_given_the_voice_store(tmp_path: Path) -> None:
    spec = CoreSpec("random:tiny", "cuda:0", dataclasses.replace(CONFIG, voice_store_dir=tmp_path), "INFO", "text",
                    0.005, 30.0)
    made = core_specs(spec, ["cuda:0", "cuda:1", "cuda:2"])
    assert [item.device for item in made] == ["cuda:0", "cuda:1", "cuda:2"]
    assert [item.engine.voice_store_dir for item in made] == [tmp_path, None, None]


def test_a_core_that_dies_fails_only_its_own_requests_and_starts_again_while_the_other_serves(
        tiny_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cores, "MIN_UPTIME_S", 0.0)

    async def kill_one(door: EngineCores, started: StartedCores) -> tuple[SynthesisSummary, SynthesisSummary]:
        lost = await door.submit(request("lost", LONG))
        kept = await door.submit(request("kept"))
        await anext(lost)
        (holder,) = [process for process in started.processes if process.holds("lost")]
        assert not holder.holds("kept")
        os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
        with pytest.raises(EngineCoreLost):
            await lost.collect()
        kept_summary = (await kept.collect())[1]
        await started.wait_for_warm_ups(1)  # the lost core, started again
        assert door.is_running and door.num_cores_running == 2 and len(started.processes) == 3
        return kept_summary, await synthesize(door, request("after"))

    kept, after = with_cores(tiny_checkpoints["custom_voice"], kill_one)
    assert kept.finish_reason is after.finish_reason is FinishReason.LENGTH


def test_a_core_that_dies_soon_after_its_start_is_left_down_and_the_door_exits_with_the_last(
        tiny_checkpoints: dict[str, Path]) -> None:
    async def kill_both(door: EngineCores, started: StartedCores) -> SynthesisSummary:
        first, second = started.processes
        os.kill(second.pid, signal.SIGKILL)  # type: ignore[arg-type]
        await second.wait_exited()
        assert door.is_running and door.num_cores_running == 1
        served = await synthesize(door, request("on-the-first"))
        os.kill(first.pid, signal.SIGKILL)  # type: ignore[arg-type]
        await door.wait_exited()
        assert not door.is_running and len(started.processes) == 2  # neither started again
        with pytest.raises(EngineStoppedError):
            await door.submit(request("none-left"))
        return served

    served = with_cores(tiny_checkpoints["custom_voice"], kill_both)
    assert served.finish_reason is FinishReason.LENGTH


def test_a_core_that_cannot_load_fails_the_start_and_the_cores_that_loaded_are_stopped(
        tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    loaded: list[EngineProcess] = []

    async def start_core(spec: CoreSpec) -> EngineProcess:
        process = await EngineProcess.start(spec)
        loaded.append(process)
        return process

    good, _ = specs(tiny_checkpoints["custom_voice"])
    bad = dataclasses.replace(good, model=str(tmp_path / "no-such-checkpoint"))
    with pytest.raises(Exception, match="no-such-checkpoint"):
        asyncio.run(EngineCores.start([good, bad], start_core))
    assert len(loaded) == 1 and not loaded[0].is_alive


class CountingCore:
    """Stands in for an engine core's process where only its reports matter: preemptions, and an exit on cue."""

    model_info = None

    def __init__(self, num_preemptions: int) -> None:
        self.num_preemptions = num_preemptions
        self._exited = asyncio.Event()

    @property
    def is_running(self) -> bool:
        return not self._exited.is_set()

    def occupancy(self) -> EngineOccupancy:
        return EngineOccupancy(0, 0, 0, self.num_preemptions, 0, 0)

    def captured_graph_batch_sizes(self) -> dict[str, list[int]]:
        return {}

    def add_step_observer(self, observer: object) -> None:
        pass

    async def warm_up(self) -> bool:
        return True

    async def wait_exited(self) -> None:
        await self._exited.wait()

    def exit(self) -> None:
        self._exited.set()

    async def stop(self) -> None:
        self.exit()


def test_preemptions_since_the_start_never_step_down_when_a_core_starts_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cores, "MIN_UPTIME_S", 0.0)

    async def run() -> list[int]:
        first, second, again = CountingCore(3), CountingCore(5), CountingCore(0)
        starting, may_start = asyncio.Event(), asyncio.Event()

        async def start_again(spec: CoreSpec) -> EngineProcess:
            starting.set()
            await may_start.wait()
            return again  # type: ignore[return-value]

        door = EngineCores(specs(Path("unused")), [first, second], start_again)  # type: ignore[list-item]
        totals = [door.occupancy().num_preemptions_total]
        first.exit()
        totals.append(door.occupancy().num_preemptions_total)  # gone, its keeper not yet told
        await starting.wait()  # its keeper has taken it down and starts it again
        totals.append(door.occupancy().num_preemptions_total)
        may_start.set()
        assert await door.wait_cores_changed(1)
        assert door.num_cores_running == 2
        totals.append(door.occupancy().num_preemptions_total)
        again.num_preemptions = 2
        totals.append(door.occupancy().num_preemptions_total)
        await door.stop()
        assert not await door.wait_cores_changed(2)
        return totals

    assert asyncio.run(asyncio.wait_for(run(), 30)) == [8, 8, 8, 8, 10]
