"""The engine core in a process of its own (EngineProcess) behaves as the engine does in this one: same codes and
audio, same errors, and when the core dies every stream and call ends with an error and nothing hangs."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

from tts_service.engine import (
    CheckpointError,
    CoreSpec,
    Engine,
    EngineConfig,
    EngineProcess,
    EngineStoppedError,
    FinishReason,
    GenerationParams,
    PromptError,
    RequestFailed,
    SamplingParams,
    SynthesisInput,
    SynthesisRequest,
    SynthesisSummary,
)
from tts_service.engine.wire import portable
from tts_service.model.checkpoint import LoadedModel

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
CONFIG = EngineConfig(max_running=4, max_waiting=8, max_positions_per_request=512)
TEXT = "The core runs in a process of its own."
SEEDED = GenerationParams(talker=SamplingParams(0.9, top_k=50), predictor=SamplingParams(0.9, top_k=50),
                          max_new_frames=12, min_new_frames=12, seed=7)


def spec_for(checkpoint: Path, config: EngineConfig = CONFIG) -> CoreSpec:
    return CoreSpec(str(checkpoint), "cpu", config, "WARNING", "text", 0.005)


def with_core(checkpoint: Path, body: Callable[[EngineProcess], Awaitable[T]],
              config: EngineConfig = CONFIG) -> T:
    async def run() -> T:
        engine = await EngineProcess.start(spec_for(checkpoint, config))
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
        with pytest.raises(RequestFailed) as failed:
            async for _ in playing:
                pass
        assert failed.value.summary.finish_reason is FinishReason.ERROR
        assert failed.value.summary.num_frames >= 1
        await engine.wait_exited()
        assert not engine.is_running
        with pytest.raises(EngineStoppedError):
            await engine.submit(speaker_request("after"))

    with_core(tiny_checkpoints["custom_voice"], kill_mid_stream)


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
        long = GenerationParams(max_new_frames=400, min_new_frames=400)
        stream = await engine.submit(SynthesisRequest("cut", SynthesisInput(TEXT, "english", "ryan"), long))
        await anext(stream)
        await asyncio.wait_for(engine.stop(), 30)
        with pytest.raises(RequestFailed):
            async for _ in stream:
                pass
        assert not engine.is_running and not engine.is_alive

    asyncio.run(stop_while_playing())


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
