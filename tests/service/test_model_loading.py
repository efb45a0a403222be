"""A server loads exactly the model it is asked for, or exits 1 naming it and why: it never serves a random model in
its place. A Hub download is retried only while its failure may pass, and only for the configured time. Random
weights, when asked for, show wherever an operator looks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import requests
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
from prometheus_client import generate_latest

from tests.service.helpers import start_server
from tests.service.processes import ROOT, free_port
from tts_service.api.config import ServerConfig
from tts_service.api.main import create_metrics
from tts_service.engine import ModelInfo
from tts_service.model import checkpoint
from tts_service.model.checkpoint import CheckpointError, LoadedModel, LoadOptions
from tts_service.model.loading import load_model
from tts_service.model.sources import DEFAULT_MODEL

EXIT_TIMEOUT_S = 120.0


def run_server(tmp_path: Path, *flags: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The server with the default model and no usable Hub, run until it exits by itself."""
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("QWEN3_TTS_", "OTEL_", "HF_"))}
    environment.update(HF_HOME=str(tmp_path / "hf-home"), **env)
    command = [sys.executable, "-m", "tts_service", "--device", "cpu", "--host", "127.0.0.1",
               "--port", str(free_port()), "--log-format", "text", *flags]
    return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=EXIT_TIMEOUT_S)


def test_a_server_whose_default_model_cannot_be_had_offline_exits_1_naming_it_and_never_serves(
        tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_server(tmp_path, env={"HF_HUB_OFFLINE": "1"})
    log = result.stderr + result.stdout
    assert result.returncode == 1, log[-4000:]
    assert f"cannot download {DEFAULT_MODEL!r}: HF_HUB_OFFLINE is set" in log
    assert "random:" not in log.replace("--model random:tiny-custom_voice", "") and "serving" not in log
    # Offline mode is no failure that passes by waiting: no retries.
    assert "retrying" not in log and time.monotonic() - started < EXIT_TIMEOUT_S / 2


def test_an_unreachable_hub_is_retried_for_the_configured_time_then_the_server_exits_1(tmp_path: Path) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"  # nothing listens there: every connection is refused
    started = time.monotonic()
    result = run_server(tmp_path, "--model-download-timeout-seconds", "4", env={"HF_ENDPOINT": unreachable})
    elapsed_s = time.monotonic() - started
    log = result.stderr + result.stdout
    assert result.returncode == 1, log[-4000:]
    assert log.count(f"cannot download {DEFAULT_MODEL} yet") >= 2  # retried, with backoff (1 s, then 2 s)
    assert f"cannot download {DEFAULT_MODEL!r} after" in log and "serving" not in log
    assert elapsed_s >= 3.0


class FakeHub:
    """snapshot_download failing with each of `errors` in turn, then succeeding; sleeps only advance a clock."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.now = 0.0
        self.sleeps: list[float] = []

    def snapshot_download(self, *args: object, **kwargs: object) -> str:
        if self.errors:
            raise self.errors.pop(0)
        return "/snapshot"

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def http_error(status: int) -> HfHubHTTPError:
    response = requests.Response()
    response.status_code = status
    return HfHubHTTPError(f"{status} from the Hub", response=response)


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    hub = FakeHub()
    monkeypatch.setattr("huggingface_hub.snapshot_download", hub.snapshot_download)
    return hub


def test_passing_hub_failures_are_retried_with_growing_delays_until_the_download_succeeds(fake_hub: FakeHub) -> None:
    fake_hub.errors = [http_error(503), http_error(429), requests.ConnectionError("refused"), http_error(500)]
    path = checkpoint.download("Qwen/x", None, 60.0, sleep=fake_hub.sleep, clock=lambda: fake_hub.now)
    assert path == Path("/snapshot") and fake_hub.sleeps == [1.0, 2.0, 4.0, 8.0]


def test_retries_stop_at_the_configured_time(fake_hub: FakeHub) -> None:
    fake_hub.errors = [http_error(503)] * 100
    with pytest.raises(CheckpointError, match=r"cannot download 'Qwen/x' after 4 attempts: 503 from the Hub"):
        checkpoint.download("Qwen/x", None, 10.0, sleep=fake_hub.sleep, clock=lambda: fake_hub.now)
    assert sum(fake_hub.sleeps) <= 10.0


@pytest.mark.parametrize("error", [RepositoryNotFoundError("no such repo", response=http_error(404).response),
                                   http_error(401), http_error(403)], ids=["missing repo", "401", "403"])
def test_failures_that_do_not_pass_by_waiting_are_not_retried(fake_hub: FakeHub, error: Exception) -> None:
    fake_hub.errors = [error]
    with pytest.raises(CheckpointError):
        checkpoint.download("Qwen/x", None, 60.0, sleep=fake_hub.sleep, clock=lambda: fake_hub.now)
    assert fake_hub.sleeps == []


def test_random_weights_and_kernel_paths_show_in_build_info_and_random_weights_in_the_model_list(
        tiny_models: dict[str, LoadedModel]) -> None:
    random_model = load_model("random:tiny-custom_voice", LoadOptions.default_for("cpu"))
    for model, is_random in ((random_model, "true"), (tiny_models["custom_voice"], "false")):
        metrics = create_metrics(ServerConfig(metrics_port=free_port()), ModelInfo.of(model))
        assert metrics is not None
        exposition = generate_latest(metrics.registry).decode()
        assert f'random_weights="{is_random}"' in exposition
        assert 'kernels="none"' in exposition  # the CPU takes no fused path
    http_port = free_port()
    server = start_server(random_model, http_port=http_port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/models", timeout=10) as response:
            assert json.loads(response.read())["data"][0]["random_weights"] is True
        with server.client() as client:
            assert client.list_voices().random_weights
    finally:
        server.stop()
