"""An engine core on one GPU of several sees only that GPU, as cuda:0, so that every thread of its process works on
it (CUDA starts each thread on device 0)."""

from __future__ import annotations

import os

import pytest
import torch

from tts_service.engine.core_process import only_device_visible


def test_a_core_on_the_nth_gpu_sees_only_that_one_as_cuda_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert only_device_visible("cuda:1") == "cuda:0"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"


def test_the_nth_gpu_is_the_nth_of_those_the_server_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, GPU-5e1f0c3a,7")
    assert only_device_visible("cuda:1") == "cuda:0"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-5e1f0c3a"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_device_without_an_index_is_left_as_it_is(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert only_device_visible(device) == device
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"


def test_a_gpu_past_those_visible_is_an_error_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(ValueError, match=r"cuda:1.*CUDA_VISIBLE_DEVICES=0"):
        only_device_visible("cuda:1")


def test_once_cuda_has_started_the_device_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert only_device_visible("cuda:1") == "cuda:1"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5"
