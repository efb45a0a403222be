"""The engine's door is declared once (door.py): the in-process engine and the process proxy implement it as
declared, the core's bridge dispatches exactly the operations declared to cross, and an operation that is not
declared is refused in the process that would send it, never left for the core to fail on."""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from tts_service.engine.config import EngineConfig
from tts_service.engine.core_process import CoreBridge, Outbox, StreamRouter
from tts_service.engine.door import CALLS, NOTICES, EngineCalls, EngineDoor, EngineNotices
from tts_service.engine.engine import Engine, EngineOccupancy
from tts_service.engine.engine_process import EngineProcess
from tts_service.engine.model_info import ModelInfo
from tts_service.engine.wire import Notice, Ready, Stop, receive
from tts_service.model.checkpoint import LoadedModel

T = TypeVar("T")
CONFIG = EngineConfig(max_running=2, max_waiting=2, max_positions_per_request=256)
DOOR_MEMBERS = sorted(name for name in dir(EngineDoor) if not name.startswith("_"))
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class NeverStarted(multiprocessing.process.BaseProcess):
    """The core's process for a proxy whose core is the test itself: never alive, nothing to wait for or kill."""

    def join(self, timeout: float | None = None) -> None:
        pass


async def socket_pair() -> tuple[Streams, Streams]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return await asyncio.open_unix_connection(sock=ours), await asyncio.open_unix_connection(sock=theirs)


async def receive_until_stop(core: Streams) -> list[object]:
    """What a core would have received before the proxy stopped it."""
    reader, writer = core
    received = []
    while not isinstance(message := await receive(reader), Stop):
        received.append(message)
    writer.close()
    return received


def sent_to_core(model: LoadedModel, body: Callable[[EngineProcess], Awaitable[None]]) -> list[object]:
    """Every message a proxy sent its core while `body` used it; the core is a stand-in that only listens."""
    async def run() -> list[object]:
        (reader, writer), core = await socket_pair()
        received = asyncio.ensure_future(receive_until_stop(core))
        ready = Ready(ModelInfo.of(model), {}, None, EngineOccupancy(0, 0, 0, 0, 0, 0))
        proxy = EngineProcess(NeverStarted(), reader, writer, ready, stall_timeout_s=30.0)
        try:
            await body(proxy)
        finally:
            await proxy.stop()
        return await received

    return asyncio.run(run())


def bridge_over(model: LoadedModel, change: Callable[[Engine], None] = lambda engine: None) -> CoreBridge:
    """A core's bridge over an engine of `model`, which `change` alters first."""
    async def run() -> CoreBridge:
        (_, writer), (_, core_writer) = await socket_pair()
        try:
            engine = Engine.create(model, CONFIG)
            change(engine)
            outbox = Outbox(writer)
            return CoreBridge(engine, outbox, StreamRouter([outbox]))
        finally:
            writer.close()
            core_writer.close()

    return asyncio.run(run())


@pytest.mark.parametrize("implementation", [Engine, EngineProcess])
@pytest.mark.parametrize("name", DOOR_MEMBERS)
def test_the_engine_and_its_process_proxy_implement_each_door_operation_as_the_door_declares_it(
        implementation: type, name: str) -> None:
    declared = inspect.getattr_static(EngineDoor, name)
    implemented = inspect.getattr_static(implementation, name)
    if isinstance(declared, property):
        assert isinstance(implemented, property)
        return
    assert inspect.signature(implemented) == inspect.signature(declared)
    assert inspect.iscoroutinefunction(implemented) == inspect.iscoroutinefunction(declared)


def test_the_core_bridge_dispatches_exactly_the_declared_operations_to_the_engine(
        tiny_models: dict[str, LoadedModel]) -> None:
    bridge = bridge_over(tiny_models["custom_voice"])
    calls, notices = bridge._calls, bridge._notices
    assert set(calls) == CALLS and set(notices) == NOTICES
    # A submit is the bridge's own: it converts the request from the wire and holds the text sent meanwhile.
    assert calls["submit"] == bridge._submit
    assert all(calls[name] == getattr(bridge.engine, name) for name in CALLS - {"submit"})
    assert all(notices[name] == getattr(bridge.engine, name) for name in NOTICES)


async def _abort_awaited(request_id: str) -> None:
    pass


def _clone_voice_not_awaited(wav_24k: object, reference_text: str | None, x_vector_only: bool) -> None:
    pass


@pytest.mark.parametrize(("name", "replacement"), [
    ("abort", _abort_awaited), ("clone_voice", _clone_voice_not_awaited), ("registered_voices", None)],
    ids=["a notice that is a coroutine", "a call that is not", "an operation that is missing"])
def test_a_bridge_over_an_engine_that_does_not_implement_the_door_as_declared_is_refused_when_it_is_built(
        tiny_models: dict[str, LoadedModel], name: str, replacement: object) -> None:
    with pytest.raises(TypeError, match=repr(name)):
        bridge_over(tiny_models["custom_voice"], lambda engine: setattr(engine, name, replacement))


@pytest.mark.parametrize(("kind", "operation"), [
    ("call", Engine.clone_voice), ("call", EngineDoor.warm_up), ("call", EngineNotices.abort),
    ("notice", EngineCalls.submit)],
    ids=["the engine's method for the door's declaration", "an operation the proxy answers itself",
         "a notice as a call", "a call as a notice"])
def test_an_operation_not_declared_to_cross_as_it_is_sent_is_refused_by_the_proxy_and_never_reaches_the_core(
        tiny_models: dict[str, LoadedModel], kind: str, operation: Callable[..., Any]) -> None:
    async def send_undeclared_then_a_declared_notice(proxy: EngineProcess) -> None:
        with pytest.raises(ValueError, match="not an operation"):
            if kind == "call":
                await proxy._call(operation)
            else:
                proxy._notify(operation)
        proxy.set_output_paused("reader", True)

    received = sent_to_core(tiny_models["custom_voice"], send_undeclared_then_a_declared_notice)
    assert received == [Notice("set_output_paused", ("reader", True))]
