"""The engine core in a process of its own (EngineProcess) behaves as the engine does in this one: same codes and
audio, same errors, and when the core dies, stops or stalls every stream and call ends with an error and nothing
hangs."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from tts_service.engine import (
    AlignmentItem,
    CheckpointError,
    CoreSpec,
    Engine,
    EngineConfig,
    EngineCoreLost,
    EngineProcess,
    EngineStoppedError,
    FinishReason,
    GenerationParams,
    PromptError,
    RequestFailed,
    RequestStream,
    SamplingParams,
    SynthesisInput,
    SynthesisRequest,
    SynthesisSummary,
    WordTiming,
    engine_process,
)
from tts_service.engine import engine as engine_module
from tts_service.engine.core_process import run_core
from tts_service.engine.engine import EngineOccupancy
from tts_service.engine.model_info import ModelInfo
from tts_service.engine.step_work import StepDone, StepWork
from tts_service.engine.wire import Ready, portable
from tts_service.model.checkpoint import LoadedModel
from tts_service.runner.runner import ModelRunner

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
CONFIG = EngineConfig(max_running=4, max_waiting=8, max_positions_per_request=512)
TEXT = "The core runs in a process of its own."
SEEDED = GenerationParams(talker=SamplingParams(0.9, top_k=50), predictor=SamplingParams(0.9, top_k=50),
                          max_new_frames=12, min_new_frames=12, seed=7)
LONG = GenerationParams(max_new_frames=400, min_new_frames=400)
STALL_TIMEOUT_S = 30.0
# Short enough for a test, long enough for the first step on a busy CPU, which pays one-time costs (about 1 s).
SHORT_STALL_TIMEOUT_S = 2.0
# Time for the server's process to notice, kill and fail, on a busy machine, beyond the stall timeout itself.
NOTICE_MARGIN_S = 3.0
STUCK_SEED = 666  # the seed of the request whose first step never ends


def spec_for(checkpoint: Path, config: EngineConfig = CONFIG, stall_timeout_s: float = STALL_TIMEOUT_S) -> CoreSpec:
    return CoreSpec(str(checkpoint), "cpu", config, "WARNING", "text", 0.005, stall_timeout_s)


def with_core(checkpoint: Path, body: Callable[[EngineProcess], Awaitable[T]],
              config: EngineConfig = CONFIG, stall_timeout_s: float = STALL_TIMEOUT_S) -> T:
    async def run() -> T:
        engine = await EngineProcess.start(spec_for(checkpoint, config, stall_timeout_s))
        try:
            return await asyncio.wait_for(body(engine), 60)
        finally:
            await engine.stop()

    return asyncio.run(run())


def in_process(model: LoadedModel, body: Callable[[Engine], Awaitable[T]]) -> T:
    async def run() -> T:
        engine = Engine.create(model, CONFIG)
        engine.start()
        try:
            return await body(engine)
        finally:
            await engine.stop()

    return asyncio.run(run())


def speaker_request(request_id: str, text: str = TEXT, **changes: object) -> SynthesisRequest:
    return SynthesisRequest(request_id, SynthesisInput(text, "english", "ryan"), SEEDED, **changes)  # type: ignore[arg-type]


def long_request(request_id: str) -> SynthesisRequest:
    return SynthesisRequest(request_id, SynthesisInput(TEXT, "english", "ryan"), LONG)


async def read_until_it_fails(stream: RequestStream) -> None:
    with pytest.raises(RequestFailed):
        async for _ in stream:
            pass


async def synthesize(engine: Engine | EngineProcess, request: SynthesisRequest) -> tuple[np.ndarray, SynthesisSummary]:
    stream = await engine.submit(request)
    return await stream.collect()


def test_a_request_through_the_core_process_makes_the_codes_and_audio_it_makes_in_process(
        tiny_checkpoints: dict[str, Path], tiny_models: dict[str, LoadedModel]) -> None:
    async def two_at_once(engine: Engine | EngineProcess) -> list[tuple[np.ndarray, SynthesisSummary]]:
        return list(await asyncio.gather(synthesize(engine, speaker_request("a")),
                                         synthesize(engine, speaker_request("b", "A second, shorter one."))))

    remote = with_core(tiny_checkpoints["custom_voice"], two_at_once)
    local = in_process(tiny_models["custom_voice"], two_at_once)
    for (remote_audio, remote_summary), (local_audio, local_summary) in zip(remote, local, strict=True):
        assert remote_summary.finish_reason is FinishReason.LENGTH and remote_summary.num_frames == 12
        np.testing.assert_array_equal(remote_summary.codes, local_summary.codes)
        # The codec's rounding depends on which rows share a call (oneDNN and cuDNN block by batch size: a few
        # 1e-6 on this CPU decoder), and the core may admit the second request a step after the first.
        np.testing.assert_allclose(remote_audio, local_audio, rtol=0, atol=1e-5)


def test_open_text_refusals_and_voice_clones_cross_the_process_as_they_work_in_process(
        tiny_checkpoints: dict[str, Path], tiny_models: dict[str, LoadedModel]) -> None:
    wav = np.sin(np.linspace(0, 400, 24000 * 2)).astype(np.float32) * 0.3

    async def session(engine: Engine | EngineProcess) -> tuple[np.ndarray, np.ndarray, str]:
        clone = await engine.clone_voice(wav, None, True)
        synthesis = SynthesisInput("", "english", clone=clone)
        stream = await engine.submit(SynthesisRequest("open", synthesis, SEEDED, is_text_open=True))
        engine.append_text("open", "Text that arrives ")
        engine.append_text("open", "in pieces.")
        engine.close_text("open")
        _, summary = await stream.collect()
        with pytest.raises(PromptError) as refused:
            await engine.submit(SynthesisRequest("bad", SynthesisInput(TEXT, "klingon", clone=clone), SEEDED))
        return summary.codes, np.asarray(clone.speaker_embedding, dtype=np.float32), refused.value.field

    remote_codes, remote_embedding, remote_field = with_core(tiny_checkpoints["base"], session)
    local_codes, local_embedding, local_field = in_process(tiny_models["base"], session)
    assert remote_field == local_field == "language"
    np.testing.assert_array_equal(remote_embedding, local_embedding)
    np.testing.assert_array_equal(remote_codes, local_codes)


def test_word_alignment_crosses_to_the_core_and_times_words_as_the_aligner_does_in_process(
        tiny_checkpoints: dict[str, Path], tiny_models: dict[str, LoadedModel]) -> None:
    """The aligner loads beside the core's engine (one CUDA context on a GPU); its timings cross as they are."""
    config = replace(CONFIG, aligner_model="random:tiny")
    clip = AlignmentItem(np.sin(np.linspace(0, 900, 24000 * 2)).astype(np.float32) * 0.3, 24000, "Three words here.")

    async def align(engine: Engine | EngineProcess) -> tuple[str | None, list[WordTiming]]:
        return engine.model_info.aligner, await engine.align_words(clip)

    remote = with_core(tiny_checkpoints["custom_voice"], align, config)

    async def local() -> tuple[str | None, list[WordTiming]]:
        engine = Engine.create(tiny_models["custom_voice"], config)
        try:
            return await align(engine)
        finally:
            await engine.stop()

    assert remote == asyncio.run(local())
    assert remote[0] == "random:tiny" and [(word.start_char, word.end_char) for word in remote[1]] == [
        (0, 5), (6, 11), (12, 16)]


def test_a_long_text_crosses_as_one_request_spoken_segment_by_segment_as_in_process(
        tiny_checkpoints: dict[str, Path], tiny_models: dict[str, LoadedModel]) -> None:
    config = replace(CONFIG, max_segment_chars=40, max_audio_s=0.24)
    text = "The first sentence is here. A second one follows it. Then a third, short. And a fourth ends it."

    async def speak(engine: Engine | EngineProcess) -> tuple[np.ndarray, SynthesisSummary]:
        return await synthesize(engine, speaker_request("long", text))

    remote_audio, remote = with_core(tiny_checkpoints["custom_voice"], speak, config)

    async def local() -> tuple[np.ndarray, SynthesisSummary]:
        engine = Engine.create(tiny_models["custom_voice"], config)
        engine.start()
        try:
            return await speak(engine)
        finally:
            await engine.stop()

    local_audio, summary = asyncio.run(local())
    assert remote.request_id == "long" and remote.num_frames == summary.num_frames >= 9  # three frames a segment
    np.testing.assert_array_equal(remote.codes, summary.codes)
    np.testing.assert_allclose(remote_audio, local_audio, rtol=0, atol=1e-5)


def test_a_long_streamed_text_crosses_as_one_request_spoken_segment_by_segment_as_in_process(
        tiny_checkpoints: dict[str, Path], tiny_models: dict[str, LoadedModel]) -> None:
    config = replace(CONFIG, max_segment_chars=40, max_audio_s=0.24)
    # Each sentence its own segment (the budget holds one, never two): eight segments of three frames.
    text = "The first sentence is here. A second one follows it. Then a third, short. And a fourth ends it. " * 2

    async def stream_in(engine: Engine | EngineProcess) -> tuple[SynthesisSummary, int]:
        params = replace(SEEDED, max_new_frames=400, min_new_frames=2)
        stream = await engine.submit(SynthesisRequest("streamed", SynthesisInput("", "english", "ryan"), params,
                                                      is_text_open=True))
        for start in range(0, len(text), 6):
            engine.append_text("streamed", text[start:start + 6])
        engine.close_text("streamed")
        chunks = [chunk async for chunk in stream]
        assert all(a.first_frame + a.num_frames == b.first_frame for a, b in itertools.pairwise(chunks))
        assert stream.summary is not None
        return stream.summary, sum(chunk.num_frames for chunk in chunks)

    remote, remote_frames = with_core(tiny_checkpoints["custom_voice"], stream_in, config)

    async def local() -> tuple[SynthesisSummary, int]:
        engine = Engine.create(tiny_models["custom_voice"], config)
        engine.start()
        try:
            return await stream_in(engine)
        finally:
            await engine.stop()

    summary, frames = asyncio.run(local())
    assert remote.request_id == summary.request_id == "streamed"
    assert remote.num_frames == remote_frames == summary.num_frames == frames == 8 * 3


def test_an_open_request_the_core_refuses_ends_its_stream_with_the_error_the_engine_raises_in_process(
        tiny_checkpoints: dict[str, Path], tiny_models: dict[str, LoadedModel]) -> None:
    """The server's process sends an open request's text without waiting for the core to take the request; a
    refusal then reaches the reader of its stream, as the same error, and the text sent meanwhile is dropped."""
    unknown_speaker = SynthesisInput("", "english", "nobody")

    async def remote(engine: EngineProcess) -> tuple[str, int]:
        stream = await engine.submit(SynthesisRequest("refused", unknown_speaker, SEEDED, is_text_open=True))
        engine.append_text("refused", "Words for a request that never runs.")
        engine.close_text("refused")
        with pytest.raises(PromptError) as refused:
            await stream.collect()
        return refused.value.field, engine.num_live_requests

    async def local(engine: Engine) -> str:
        with pytest.raises(PromptError) as refused:
            await engine.submit(SynthesisRequest("refused", unknown_speaker, SEEDED, is_text_open=True))
        return refused.value.field

    remote_field, num_live = with_core(tiny_checkpoints["custom_voice"], remote)
    assert remote_field == in_process(tiny_models["custom_voice"], local) == "speaker"
    assert num_live == 0


def test_killing_the_core_mid_stream_fails_every_stream_and_call_and_nothing_hangs(
        tiny_checkpoints: dict[str, Path]) -> None:
    long = GenerationParams(max_new_frames=400, min_new_frames=400)

    async def kill_mid_stream(engine: EngineProcess) -> None:
        playing = await engine.submit(SynthesisRequest("playing", SynthesisInput(TEXT, "english", "ryan"), long))
        await anext(playing)
        os.kill(engine.pid, signal.SIGKILL)
        with pytest.raises(EngineCoreLost) as failed:
            async for _ in playing:
                pass
        assert failed.value.summary.finish_reason is FinishReason.ERROR
        assert failed.value.summary.num_frames >= 1
        await engine.wait_exited()
        assert not engine.is_running
        with pytest.raises(EngineStoppedError):
            await engine.submit(speaker_request("after"))

    with_core(tiny_checkpoints["custom_voice"], kill_mid_stream)


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[float]:
    """The process stopped (SIGSTOP) from when this yields its monotonic time; let go again after, so that a test
    that fails leaves no stopped process behind (continuing one that was killed meanwhile does nothing)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield time.monotonic()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def test_a_stopped_core_holding_work_is_killed_and_its_streams_and_calls_end_within_the_stall_timeout(
        tiny_checkpoints: dict[str, Path]) -> None:
    async def stop_mid_stream(engine: EngineProcess) -> tuple[float, str | None]:
        playing = await engine.submit(SynthesisRequest("playing", SynthesisInput(TEXT, "english", "ryan"), LONG))
        await anext(playing)
        assert engine.pid is not None
        with stopped(engine.pid) as stopped_at:
            waiting = asyncio.ensure_future(engine.submit(speaker_request("waiting")))
            with pytest.raises(EngineCoreLost) as lost:
                async for _ in playing:
                    pass
            ended_s = time.monotonic() - stopped_at
            with pytest.raises(EngineStoppedError):
                await waiting
            await engine.wait_exited()
            assert not engine.is_running
            await asyncio.wait_for(engine.stop(), NOTICE_MARGIN_S)  # it was killed: a stopped core would not end
            assert not engine.is_alive
        return ended_s, lost.value.summary.error

    ended_s, reason = with_core(tiny_checkpoints["custom_voice"], stop_mid_stream,
                                stall_timeout_s=SHORT_STALL_TIMEOUT_S)
    assert ended_s < SHORT_STALL_TIMEOUT_S + NOTICE_MARGIN_S
    assert reason == f"the engine core made no progress for {SHORT_STALL_TIMEOUT_S:g} s"


def run_core_whose_marked_step_never_ends(spec: CoreSpec, channels: list[socket.socket]) -> None:
    """The core's entry point, with a runner that never returns from the step that prefills the marked request;
    its event loop goes on (it answers calls and beats)."""
    original = engine_module.run_step

    def stuck_on_the_marked_request(runner: ModelRunner, work: StepWork,
                                    hand_out_previous: Callable[[], None] | None) -> StepDone:
        if any(item.params.seed == STUCK_SEED for item in work.step.prefills):
            threading.Event().wait()
        return original(runner, work, hand_out_previous)

    engine_module.run_step = stuck_on_the_marked_request
    run_core(spec, channels)


def test_a_core_whose_step_never_ends_is_killed_though_its_event_loop_still_answers_and_says_where_it_was_stuck(
        tiny_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(engine_process, "run_core", run_core_whose_marked_step_never_ends)
    marked = GenerationParams(max_new_frames=12, min_new_frames=12, seed=STUCK_SEED)

    async def get_stuck(engine: EngineProcess) -> tuple[list[object], float]:
        started = time.monotonic()
        stuck = await engine.submit(SynthesisRequest("stuck", SynthesisInput(TEXT, "english", "ryan"), marked))
        await asyncio.sleep(SHORT_STALL_TIMEOUT_S / 2)
        answered = await engine.registered_voices("anyone")  # the core's loop runs: only its step is stuck
        with pytest.raises(EngineCoreLost):
            await stuck.collect()
        ended_s = time.monotonic() - started
        await engine.wait_exited()
        await asyncio.wait_for(engine.stop(), NOTICE_MARGIN_S)  # it was killed: a core stuck in a step would not end
        assert not engine.is_alive
        return answered, ended_s

    answered, ended_s = with_core(tiny_checkpoints["custom_voice"], get_stuck, stall_timeout_s=SHORT_STALL_TIMEOUT_S)
    assert answered == []
    assert ended_s < SHORT_STALL_TIMEOUT_S + NOTICE_MARGIN_S
    # Before it was killed, the core wrote every thread's stack to its stderr: the stuck one's names the call.
    assert "in stuck_on_the_marked_request" in capfd.readouterr().err


def test_an_idle_core_and_a_request_that_outlasts_the_stall_timeout_are_not_taken_for_stalled(
        tiny_checkpoints: dict[str, Path]) -> None:
    async def idle_then_slow_reader(engine: EngineProcess) -> SynthesisSummary:
        await asyncio.sleep(2 * SHORT_STALL_TIMEOUT_S)  # nothing held: the silence between beats is no stall
        params = GenerationParams(max_new_frames=60, min_new_frames=60)
        stream = await engine.submit(SynthesisRequest("slow", SynthesisInput(TEXT, "english", "ryan"), params))
        await anext(stream)
        # Held all along: stepping, then parked or finished while its reader waits.
        await asyncio.sleep(1.5 * SHORT_STALL_TIMEOUT_S)
        _, summary = await stream.collect()
        assert engine.is_running
        return summary

    summary = with_core(tiny_checkpoints["custom_voice"], idle_then_slow_reader, stall_timeout_s=SHORT_STALL_TIMEOUT_S)
    assert summary.finish_reason is FinishReason.LENGTH


def test_a_reader_that_falls_behind_pauses_its_request_in_the_core_until_it_reads_again(
        tiny_checkpoints: dict[str, Path]) -> None:
    config = EngineConfig(max_running=4, max_waiting=8, max_positions_per_request=512, max_unread_audio_s=0.4)
    params = GenerationParams(max_new_frames=60, min_new_frames=60)

    async def fall_behind(engine: EngineProcess) -> tuple[int, int, int]:
        stream = await engine.submit(SynthesisRequest("slow", SynthesisInput(TEXT, "english", "ryan"), params))
        for _ in range(200):  # the request parks once its unread audio passes the limit
            if engine.occupancy().num_parked == 1:
                break
            await asyncio.sleep(0.05)
        parked, unread = engine.occupancy().num_parked, stream.num_unread_frames
        _, summary = await stream.collect()
        return parked, unread, summary.num_frames

    parked, unread, num_frames = with_core(tiny_checkpoints["custom_voice"], fall_behind, config)
    limit = 5  # 0.4 s of 12.5 Hz frames
    assert parked == 1
    assert limit < unread < 60
    assert num_frames == 60


def test_stop_ends_the_core_and_its_live_requests_with_an_error(tiny_checkpoints: dict[str, Path]) -> None:
    async def stop_while_playing() -> None:
        engine = await EngineProcess.start(spec_for(tiny_checkpoints["custom_voice"]))
        stream = await engine.submit(long_request("cut"))
        await anext(stream)
        await asyncio.wait_for(engine.stop(), 30)
        await read_until_it_fails(stream)
        assert not engine.is_running and not engine.is_alive

    asyncio.run(stop_while_playing())


def test_a_core_serves_a_front_door_beside_its_owner_whose_going_ends_only_its_own_requests(
        tiny_checkpoints: dict[str, Path]) -> None:
    """Two front doors on one core: each gets the audio of its own requests as a door alone does, and step
    observations go to the owner only; the door beside it leaving ends its requests there and nothing else, and
    the owner's stop ends the core for both."""
    async def two_doors() -> None:
        owner = await EngineProcess.start(spec_for(tiny_checkpoints["custom_voice"]), num_further_doors=1)
        beside = await EngineProcess.attach(owner.further_channels.pop(), STALL_TIMEOUT_S)
        assert owner.further_channels == []
        owner_steps: list[object] = []
        beside_steps: list[object] = []
        owner.add_step_observer(owner_steps.append)
        beside.add_step_observer(beside_steps.append)
        try:
            alone = await synthesize(owner, speaker_request("alone"))
            (owner_audio, owner_summary), (beside_audio, beside_summary) = await asyncio.gather(
                synthesize(owner, speaker_request("a")), synthesize(beside, speaker_request("b")))
            for audio, summary in ((owner_audio, owner_summary), (beside_audio, beside_summary)):
                np.testing.assert_array_equal(summary.codes, alone[1].codes)
                np.testing.assert_allclose(audio, alone[0], rtol=0, atol=1e-5)
            assert (owner_summary.request_id, beside_summary.request_id) == ("a", "b")
            assert owner_steps and not beside_steps

            kept, left = await owner.submit(long_request("kept")), await beside.submit(long_request("left"))
            await anext(kept)
            await anext(left)
            await asyncio.wait_for(beside.stop(), 30)
            await read_until_it_fails(left)
            assert not beside.is_running and owner.is_running and owner.num_live_requests == 1
            assert (await anext(kept)).num_frames > 0  # the owner's request plays on
            owner.abort("kept")
            async for _ in kept:
                pass
            assert kept.summary is not None and kept.summary.finish_reason is FinishReason.ABORTED
            assert owner.occupancy().num_running == 0  # the door that left has nothing left in the engine
        finally:
            await asyncio.wait_for(owner.stop(), 30)
        assert not owner.is_alive

    asyncio.run(two_doors())


def test_a_front_door_beside_the_owner_loses_its_streams_when_the_owner_stops_the_core(
        tiny_checkpoints: dict[str, Path]) -> None:
    async def owner_stops() -> None:
        owner = await EngineProcess.start(spec_for(tiny_checkpoints["custom_voice"]), num_further_doors=1)
        beside = await EngineProcess.attach(owner.further_channels.pop(), STALL_TIMEOUT_S)
        stream = await beside.submit(long_request("cut"))
        await anext(stream)
        await asyncio.wait_for(owner.stop(), 30)
        await read_until_it_fails(stream)
        await asyncio.wait_for(beside.wait_exited(), 10)
        assert not beside.is_running and not beside.is_alive and beside.pid is None

    asyncio.run(owner_stops())


def test_a_core_writes_nothing_more_to_a_front_door_that_has_gone(tiny_checkpoints: dict[str, Path],
                                                                  capfd: pytest.CaptureFixture[str]) -> None:
    """Its beats would go on into the lost socket, which asyncio answers with a warning at every write."""
    async def leave_and_wait() -> None:
        owner = await EngineProcess.start(spec_for(tiny_checkpoints["custom_voice"], stall_timeout_s=1.0),
                                          num_further_doors=1)
        beside = await EngineProcess.attach(owner.further_channels.pop(), 1.0)
        await beside.stop()
        await asyncio.sleep(3.0)  # twelve beats
        await owner.stop()

    asyncio.run(leave_and_wait())
    assert "socket.send() raised exception" not in capfd.readouterr().err


def test_the_owner_closes_the_further_channels_nobody_took_when_it_stops(tiny_checkpoints: dict[str, Path]) -> None:
    """A channel left open in the owner would keep its socket alive after the door it was meant for had gone."""
    async def start_and_stop() -> socket.socket:
        owner = await EngineProcess.start(spec_for(tiny_checkpoints["custom_voice"]), num_further_doors=1)
        (untaken,) = owner.further_channels
        await asyncio.wait_for(owner.stop(), 30)
        assert owner.further_channels == []
        return untaken

    assert asyncio.run(start_and_stop()).fileno() == -1


def test_a_model_that_cannot_load_raises_its_own_error_in_the_servers_process(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError):
        asyncio.run(EngineProcess.start(spec_for(tmp_path / "no-such-checkpoint")))


def test_an_error_that_cannot_cross_the_process_becomes_a_runtime_error_that_names_it() -> None:
    class Local(Exception):  # defined in a function: pickle cannot find it by name
        pass

    crossed = portable(Local("lost in transit"))
    assert type(crossed) is RuntimeError and str(crossed) == "Local: lost in transit"
    kept = portable(PromptError("text", "must not be empty"))
    assert type(kept) is PromptError and kept.field == "text"


def test_the_core_exits_when_the_servers_process_dies_without_a_word(tiny_checkpoints: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    """A server killed with SIGKILL leaves no core holding the GPU: the core sees its socket close and ends."""
    script = tmp_path / "server.py"
    script.write_text(f"""
import asyncio, sys
from tests.engine.test_engine_process import spec_for
from tts_service.engine import EngineProcess

async def main():
    engine = await EngineProcess.start(spec_for({str(tiny_checkpoints["custom_voice"])!r}))
    sys.stdout.write(f"{{engine.pid}}\\n")
    sys.stdout.flush()
    await asyncio.Event().wait()

if __name__ == "__main__":
    asyncio.run(main())
""")
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    server = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        core_pid = int(server.stdout.readline())
        server.kill()
        server.wait(timeout=30)
        deadline = time.monotonic() + 30
        while pid_is_running(core_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_is_running(core_pid)
    finally:
        server.kill()


def pid_is_running(pid: int) -> bool:
    """Whether `pid` names a live process (a zombie, dead but not yet reaped by its parent, does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_an_engine_process_left_behind_by_a_closed_event_loop_is_discarded_without_an_error(
        tiny_models: dict[str, LoadedModel], monkeypatch: pytest.MonkeyPatch) -> None:
    """Its receiving task, discarded unfinished once the loop has closed, has no streams to fail on that loop."""
    raised: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", raised.append)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ready = Ready(ModelInfo.of(tiny_models["custom_voice"]), {}, None, EngineOccupancy(0, 0, 0, 0, 0, 1))

    async def start() -> EngineProcess:
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        return EngineProcess(multiprocessing.get_context("spawn").Process(), reader, writer, ready, 30.0)

    loop = asyncio.new_event_loop()
    engine = loop.run_until_complete(start())
    loop.close()
    del engine
    gc.collect()
    theirs.close()
    assert raised == []
