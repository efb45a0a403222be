"""Fixtures of the GPU tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def fp32_convolutions() -> Iterator[None]:
    """cuDNN picks its convolution kernel by the batch size, and in TF32 (PyTorch's default for cuDNN) two kernels
    can round apart by ~1e-4 over the codec's layers; in fp32 they agree to ~1e-6, far below what a mistake in
    padding or state would show."""
    was_allowed = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = was_allowed
