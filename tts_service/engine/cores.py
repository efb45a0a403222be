"""Every GPU of a node behind one door: an engine core per device (`--device cuda:0,cuda:1`, or `--device all`).

Each core is an `EngineProcess`: a process with its own CUDA context, model, KV cache and graphs, so that no GPU
waits for another's steps. `EngineCores` is the one door the API sees in front of them (`EngineDoor`).

- A request goes to the running core with the fewest live requests, the first on a tie. That count is this
  process's own, exact from the moment a request is sent (the cores' occupancy reports trail by a turn of their
  loops). Everything that follows for the request (text, its close, a cancel) goes to the core that holds it.
- Registered voices live in the first core's store, the only one given `--voice-store`. A request carries its
  registered voice whole (the clone), so every core speaks every registered voice.
- Cloning from reference audio and word alignment go where a new request would.
- A core that exits unasked (or that its stall watch kills) fails its own requests and calls, and only those
  (EngineCoreLost: UNAVAILABLE, which a client retries), and is started again while the others serve. One that
  exits within `MIN_UPTIME_S` of its start, or that cannot be started and warmed up, is left down and the others
  serve on. The door runs while a core does; `wait_exited` returns once none does or will, and the server then
  stops for its supervisor to restart it. While every core is starting again at once, calls get UNAVAILABLE and
  the server's health says NOT_SERVING until one runs (`wait_cores_changed`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from observability.metrics import StepObservation
from tts_service.engine.core_process import CoreSpec
from tts_service.engine.engine import EngineOccupancy, EngineStoppedError
from tts_service.engine.engine_process import EngineProcess
from tts_service.engine.model_info import ModelInfo
from tts_service.engine.step_observers import StepObservers
from tts_service.engine.streams import RequestStream, SynthesisRequest
from tts_service.engine.voice_files import RegisteredVoice
from tts_service.model.aligner import AlignmentItem, WordTiming
from tts_service.model.prompts import VoiceClone

logger = logging.getLogger(__name__)

# A core that exits sooner than this after its start is not started again: it would only fail again.
MIN_UPTIME_S = 60.0

StartCore = Callable[[CoreSpec], Awaitable[EngineProcess]]


def core_specs(spec: CoreSpec, devices: Sequence[str]) -> list[CoreSpec]:
    """One core's spec per device; only the first keeps the voice store (see the module's docstring)."""
    without_store = dataclasses.replace(spec.engine, voice_store_dir=None)
    return [dataclasses.replace(spec, device=device, engine=spec.engine if index == 0 else without_store)
            for index, device in enumerate(devices)]


@dataclass
class _Core:
    spec: CoreSpec
    process: EngineProcess | None  # None while it starts again, and once it is left down
    started_at: float
    is_starting: bool = False


class EngineCores(StepObservers):
    """Engine cores, one per device, behind one door (see the module's docstring)."""

    def __init__(self, specs: Sequence[CoreSpec], processes: Sequence[EngineProcess],
                 start_core: StartCore = EngineProcess.start, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        now = clock()
        self._cores = [_Core(spec, process, now) for spec, process in zip(specs, processes, strict=True)]
        self.model_info: ModelInfo = processes[0].model_info
        self._graph_batch_sizes = processes[0].captured_graph_batch_sizes()
        self._start_core = start_core
        self._is_stopping = False
        self._exited = asyncio.Event()
        self._cores_changed = asyncio.Event()
        # Preemptions of cores that have exited: the total counts since the door's start, so it never steps down
        # when a core is started again (a counter that did would read as a reset).
        self._num_retired_preemptions = 0
        self._keepers = [asyncio.get_running_loop().create_task(self._keep_running(core), name="tts-core-keeper")
                         for core in self._cores]

    @classmethod
    async def start(cls, specs: Sequence[CoreSpec], start_core: StartCore = EngineProcess.start) -> EngineCores:
        """Start every core at once and wait until each engine runs. Raises the first core's failure to load,
        after stopping the cores that did."""
        started = await asyncio.gather(*(start_core(spec) for spec in specs), return_exceptions=True)
        failures = [result for result in started if isinstance(result, BaseException)]
        if failures:
            await asyncio.gather(*(result.stop() for result in started if isinstance(result, EngineProcess)))
            raise failures[0]
        processes = [result for result in started if isinstance(result, EngineProcess)]
        logger.info("%d engine cores run, on %s", len(processes), ", ".join(spec.device for spec in specs))
        return cls(specs, processes, start_core)

    # -- what the server reads ------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return not self._is_stopping and bool(self._running())

    @property
    def num_cores_running(self) -> int:
        return len(self._running())

    def occupancy(self) -> EngineOccupancy:
        """The running cores' loads, added up. Preemptions count since the door's start: every core's last report
        (one that has just exited too) and those of the cores that exited before."""
        loads = [process.occupancy() for process in self._running()]
        total = EngineOccupancy(*(sum(getattr(load, item.name) for load in loads)
                                  for item in dataclasses.fields(EngineOccupancy)))
        num_preemptions = self._num_retired_preemptions + sum(
            core.process.occupancy().num_preemptions_total for core in self._cores if core.process is not None)
        return dataclasses.replace(total, num_preemptions_total=num_preemptions)

    def captured_graph_batch_sizes(self) -> dict[str, list[int]]:
        return self._graph_batch_sizes

    def add_step_observer(self, observer: Callable[[StepObservation], None]) -> None:
        super().add_step_observer(observer)
        for process in self._running():
            process.add_step_observer(observer)

    def remove_step_observer(self, observer: Callable[[StepObservation], None]) -> None:
        super().remove_step_observer(observer)
        for process in self._running():
            process.remove_step_observer(observer)

    async def wait_exited(self) -> None:
        """Return once no core runs or will run again."""
        await self._exited.wait()

    async def wait_cores_changed(self, num_running_seen: int) -> bool:
        """Return once `num_cores_running` differs from `num_running_seen` (at once if it already does, so that a
        caller who was busy misses no change): True while a core runs or will, False once the door has exited."""
        while not self._exited.is_set() and self.num_cores_running == num_running_seen:
            await self._cores_changed.wait()
        return not self._exited.is_set()

    # -- calls ------------------------------------------------------------------------------------

    async def submit(self, request: SynthesisRequest) -> RequestStream:
        if self._holder(request.request_id) is not None:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        return await self._least_loaded().submit(request)

    def append_text(self, request_id: str, fragment: str) -> None:
        if (holder := self._holder(request_id)) is not None:
            holder.append_text(request_id, fragment)

    def close_text(self, request_id: str) -> None:
        if (holder := self._holder(request_id)) is not None:
            holder.close_text(request_id)

    def abort(self, request_id: str) -> None:
        if (holder := self._holder(request_id)) is not None:
            holder.abort(request_id)

    def set_output_paused(self, request_id: str, is_paused: bool) -> None:
        if (holder := self._holder(request_id)) is not None:
            holder.set_output_paused(request_id, is_paused)

    async def warm_up(self) -> bool:
        """Each core's warm-up synthesis, all at once."""
        return all(await asyncio.gather(*(process.warm_up() for process in self._running())))

    async def clone_voice(self, wav_24k: np.ndarray, reference_text: str | None, x_vector_only: bool) -> VoiceClone:
        return await self._least_loaded().clone_voice(wav_24k, reference_text, x_vector_only)

    async def create_voice(self, wav_24k: np.ndarray, reference_text: str | None, x_vector_only: bool,
                           owner: str) -> RegisteredVoice:
        return await self._voice_keeper().create_voice(wav_24k, reference_text, x_vector_only, owner)

    async def registered_voice(self, voice_id: str, owner: str) -> RegisteredVoice:
        return await self._voice_keeper().registered_voice(voice_id, owner)

    async def registered_voices(self, owner: str) -> list[RegisteredVoice]:
        return await self._voice_keeper().registered_voices(owner)

    async def delete_voice(self, voice_id: str, owner: str) -> None:
        await self._voice_keeper().delete_voice(voice_id, owner)

    async def align_words(self, item: AlignmentItem) -> list[WordTiming]:
        return await self._least_loaded().align_words(item)

    async def stop(self) -> None:
        """Stop every core (their live requests end with an error: drain first), a core starting again too."""
        self._is_stopping = True
        for keeper in self._keepers:
            keeper.cancel()
        await asyncio.gather(*self._keepers, return_exceptions=True)
        await asyncio.gather(*(core.process.stop() for core in self._cores if core.process is not None))
        self._exited.set()
        self._say_cores_changed()

    # -- placement ----------------------------------------------------------------------------------

    def _running(self) -> list[EngineProcess]:
        return [core.process for core in self._cores if core.process is not None and core.process.is_running]

    def _least_loaded(self) -> EngineProcess:
        running = self._running()
        if not running:
            raise EngineStoppedError("no engine core is running")
        return min(running, key=lambda process: process.num_live_requests)

    def _holder(self, request_id: str) -> EngineProcess | None:
        return next((process for process in self._running() if process.holds(request_id)), None)

    def _voice_keeper(self) -> EngineProcess:
        keeper = self._cores[0]
        if keeper.process is None or not keeper.process.is_running:
            raise EngineStoppedError(f"the engine core that keeps the registered voices ({keeper.spec.device}) is "
                                     "not running")
        return keeper.process

    async def _keep_running(self, core: _Core) -> None:
        """Start `core` again whenever it exits unasked (see the module's docstring); once it is left down and no
        other core runs or starts, the door has exited."""
        try:
            while core.process is not None:
                await core.process.wait_exited()
                if self._is_stopping:
                    return
                uptime_s = self.clock() - core.started_at
                self._num_retired_preemptions += core.process.occupancy().num_preemptions_total
                core.process = None
                self._say_cores_changed()
                if uptime_s < MIN_UPTIME_S:
                    logger.error("the engine core on %s exited %.0f s after its start: it is left down, the other "
                                 "cores serve on", core.spec.device, uptime_s)
                    return
                logger.error("the engine core on %s exited: it starts again, the other cores serve meanwhile",
                             core.spec.device)
                core.process = await self._restart(core)
                self._say_cores_changed()
        finally:
            if not self._is_stopping and all(other.process is None and not other.is_starting
                                             for other in self._cores):
                self._exited.set()
                self._say_cores_changed()

    def _say_cores_changed(self) -> None:
        """Wake every waiter of `wait_cores_changed` to look again; later waits wait for the next change."""
        self._cores_changed.set()
        self._cores_changed = asyncio.Event()

    async def _restart(self, core: _Core) -> EngineProcess | None:
        """The core started again and warmed up (as at the server's start), or None if it could not be."""
        core.is_starting = True
        process = None
        try:
            process = await self._start_core(core.spec)
            await process.warm_up()
        except Exception as error:  # whatever kept it from loading or speaking, the others serve on
            logger.error("the engine core on %s could not start again (%s): it is left down, the other cores "
                         "serve on", core.spec.device, error)
            if process is not None:
                await process.stop()
            return None
        finally:
            core.is_starting = False
        core.started_at = self.clock()
        for observer in self._step_observers:
            process.add_step_observer(observer)
        logger.info("the engine core on %s runs again", core.spec.device)
        return process
