"""The real server as its own process (`python -m tts_service` on a tiny random model), for tests that need
what only a process has: its command line, its environment, its log output, its ports."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
SERVER_START_TIMEOUT_S = 120.0


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    target: str
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def log_tail(self) -> str:
        return self.log_text()[-4000:]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_serving(server: ServerProcess) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    with grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                pytest.fail(f"the server exited with {server.process.returncode} while starting:\n{server.log_tail()}")
            try:
                status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass  # not listening yet
            time.sleep(0.25)
    pytest.fail(f"the server was not SERVING after {SERVER_START_TIMEOUT_S:.0f} s:\n{server.log_tail()}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@contextlib.contextmanager
def server_process(directory: Path, *flags: str, env: Mapping[str, str] | None = None,
                   model: str = "random:tiny-custom_voice") -> Iterator[ServerProcess]:
    """A SERVING server process on 127.0.0.1 with `flags`, logging into `directory`; stopped with SIGTERM."""
    log = directory / "server.log"
    port = free_port()
    # The server reads QWEN3_TTS_* and OTEL_* variables: none from the caller's environment may leak in.
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("QWEN3_TTS_", "OTEL_"))}
    environment.update(env or {})
    command = [sys.executable, "-m", "tts_service", "--model", model, "--device", "cpu", "--host", "127.0.0.1",
               "--port", str(port), *flags]
    with open(log, "wb") as log_file:
        process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=log_file, stderr=subprocess.STDOUT)
    running = ServerProcess(process, f"127.0.0.1:{port}", log)
    try:
        wait_until_serving(running)
        yield running
    finally:
        stop(process)
