"""Fixtures shared across the suite. The model fixtures import torch only when a test asks for them, so that
the scheduler's tests run where torch is not installed (CI proves it in a venv without torch)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tts_service.model.checkpoint import LoadedModel

MODEL_TYPES = ("custom_voice", "voice_design", "base")


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny random checkpoint directory per model type, written once per test session."""
    from tts_service.model.random_checkpoint import write_random_checkpoint

    root = tmp_path_factory.mktemp("checkpoints")
    return {kind: write_random_checkpoint(root / kind, f"tiny-{kind}", seed=index)
            for index, kind in enumerate(MODEL_TYPES)}


@pytest.fixture(scope="session")
def tiny_models(tiny_checkpoints: dict[str, Path]) -> dict[str, LoadedModel]:
    import torch

    from tts_service.model.checkpoint import LoadOptions
    from tts_service.model.loading import load_model

    options = LoadOptions(device=torch.device("cpu"), dtype=torch.float32)
    return {kind: load_model(str(path), options) for kind, path in tiny_checkpoints.items()}
