"""A real gRPC server on loopback, serving a tiny random model on the CPU, for the service tests.

The server runs on its own event loop in a background thread, as it would in its own process;
the tests talk to it through the blocking Python client over a real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import grpc

from clients.qwen3_tts_client import Connection, Generation, TtsClient, Voice
from observability.metrics import ServiceMetrics
from tts_service.api.config import FLAGS, ServerConfig
from tts_service.api.server import TtsServer
from tts_service.engine.engine import Engine
from tts_service.model.checkpoint import LoadedModel

T = TypeVar("T")
SAMPLES_PER_FRAME = 1920
NATIVE_RATE = 24000
# The engine's fields by the names of the server's flags that set them: max_concurrent -> max_running.
_ENGINE_FIELDS = {flag.key: flag.field.name for flag in FLAGS if flag.is_engine}


def with_settings(config: ServerConfig, **settings: Any) -> ServerConfig:
    """`config` with `settings` named as ServerConfig's fields or as the server's flags for the engine's."""
    engine = {_ENGINE_FIELDS[name]: settings.pop(name) for name in list(settings) if name in _ENGINE_FIELDS}
    return replace(config, **settings, engine=replace(config.engine, **engine))


# Small limits keep every request a few frames long: the tiny model takes ~60 ms a frame on a CPU.
TEST_CONFIG = with_settings(ServerConfig(), model="(test)", host="127.0.0.1", port=0, max_concurrent=4,
                            max_waiting=16, max_text_chars=400, max_document_chars=400, max_audio_seconds=0.48,
                            max_reference_audio_seconds=5.0, stream_idle_timeout_seconds=1.5,
                            drain_timeout_seconds=10.0)
RYAN = Voice(speaker="ryan", language="english")
GREEDY = Generation(temperature=0.0)


@dataclass
class RunningServer:
    server: TtsServer
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    model: LoadedModel | None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    @property
    def engine(self) -> Engine:
        assert self.server.steps.engine is not None
        return self.server.steps.engine

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the server's loop (engine and server calls belong there)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def client(self, **connection: Any) -> TtsClient:
        return TtsClient(Connection(target=connection.pop("target", self.target), **connection))

    def attach_engine(self, metrics: ServiceMetrics | None = None) -> None:
        """Load the engine and start serving speech, as the server's main does once the model is up."""
        assert self.model is not None

        async def attach() -> None:
            engine = Engine.create(self.model, self.server.config.engine)
            engine.start()
            await self.server.serve(engine, metrics)

        self.run(attach())

    def stop(self) -> None:
        self.run(self.server.shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def start_server(model: LoadedModel | None, config: ServerConfig = TEST_CONFIG, with_engine: bool = True,
                 **overrides: Any) -> RunningServer:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-grpc-server", daemon=True)
    thread.start()

    async def boot() -> TtsServer:
        server = TtsServer(with_settings(config, **overrides))
        await server.start()
        return server

    server = asyncio.run_coroutine_threadsafe(boot(), loop).result(timeout=30)
    running = RunningServer(server, loop, thread, model)
    if with_engine:
        running.attach_engine()
    return running


def status_of(responses: Iterator[Any]) -> grpc.StatusCode:
    """How a call ends: OK, or the status of the error it ends with."""
    try:
        for _ in responses:
            pass
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def seconds_until_closed(sock: socket.socket) -> float:
    """How long the server takes to close `sock`, reading (and dropping) whatever it sends until then."""
    started = time.monotonic()
    with contextlib.suppress(ConnectionResetError):
        while sock.recv(65536):
            pass
    return time.monotonic() - started
