"""The speaker encoder's front end on a GPU: no torch.stft (cuFFT faulted beside the engine's kernels,
tts_service/model/log_mel.py), and the host's log-mel frames to float32 rounding."""

from __future__ import annotations

import pytest
import torch

from tests import signals
from tts_service.model.speaker_encoder import log_mel_spectrogram

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_on_a_gpu_the_front_end_gives_the_hosts_frames_without_cufft(monkeypatch: pytest.MonkeyPatch) -> None:
    wav = torch.from_numpy(signals.sweep_signal(2 * 24000 + 77, 0, 200.0))[None]
    on_host = log_mel_spectrogram(wav)

    def no_stft(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.stft ran on the GPU")

    monkeypatch.setattr(torch, "stft", no_stft)
    on_gpu = log_mel_spectrogram(wav.cuda()).cpu()
    torch.testing.assert_close(on_gpu, on_host, rtol=0.0, atol=1e-4)
