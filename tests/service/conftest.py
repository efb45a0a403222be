"""Fixtures: one server per test module on the tiny CustomVoice model and one on the tiny Base (voice clone)
model, each with a client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from clients.qwen3_tts_client import TtsClient
from tests.service.helpers import RunningServer, start_server
from tts_service.model.checkpoint import LoadedModel


@pytest.fixture(scope="module")
def custom_voice_server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(tiny_models["custom_voice"])
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(custom_voice_server: RunningServer) -> Iterator[TtsClient]:
    with custom_voice_server.client() as tts:
        yield tts



@pytest.fixture(scope="module")
def base_server(tiny_models: dict[str, LoadedModel]) -> Iterator[RunningServer]:
    running = start_server(tiny_models["base"])
    yield running
    running.stop()


@pytest.fixture(scope="module")
def base_client(base_server: RunningServer) -> Iterator[TtsClient]:
    with base_server.client() as tts:
        yield tts
