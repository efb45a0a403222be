"""Log-mel frames on a GPU with the short-time Fourier transform as one matrix product, not cuFFT.

transformers' WhisperFeatureExtractor computes the forced aligner's frames with `torch.stft`, which on a GPU runs cuFFT
through plans that PyTorch caches by shape, so every new clip length makes a plan. Under word-timestamp load, with the
aligner's kernels held to 16 SMs beside the engine's frames, cuFFT's `regular_fft_r2c` kernel faulted with an illegal
address (a CUDA core dump named it; BENCHMARKS.md, "A fault under word-timestamp load"). Here each frame's transform is
a product with a fixed basis (the window times cosines and sines), so the path holds no plans, no cuFFT, and only
cuBLAS products, in float64: no TF32 setting can round it, and the values are the transform's to float32 rounding
(tests/model/test_log_mel.py). The speaker encoder's front end takes the same product on a GPU. On the host both keep
`torch.stft`, bitwise the references'.

`MatrixLogMel` follows the extractor for clips padded together (`padding=True`, zeros): frames centred by reflecting
each edge by half a window, a periodic Hann window, the power of each bin, the last frame dropped, the mel filters,
log10 clamped at 1e-10, floored at 8 below the clip's peak (over its padded frames), then (x + 4) / 4.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers import WhisperFeatureExtractor


def dft_basis(window: torch.Tensor) -> torch.Tensor:
    """[n_fft, 2 * bins] float64 on the window's device: the window times the cosine, then the sine, of each
    one-sided bin (n_fft // 2 + 1 of them)."""
    n_fft = window.shape[0]
    # (n * k) mod n_fft first, so that the angles are exact multiples of 2 pi / n_fft.
    turns = torch.outer(torch.arange(n_fft), torch.arange(n_fft // 2 + 1)) % n_fft
    angles = turns.double() * (2 * math.pi / n_fft)
    weights = window.double().cpu()[:, None]
    return torch.cat([weights * torch.cos(angles), weights * torch.sin(angles)], dim=1).to(window.device)


def short_time_power(signal: torch.Tensor, basis: torch.Tensor, hop: int) -> torch.Tensor:
    """[B, frames, bins] float64: each bin's power in each window of `signal` [B, T] (not centred: 1 + (T - n_fft)
    // hop frames, as `torch.stft(center=False)`), by a product with `dft_basis`."""
    n_fft, num_bins = basis.shape[0], basis.shape[1] // 2
    spectrum = signal.double().unfold(-1, n_fft, hop) @ basis
    return spectrum[..., :num_bins].square() + spectrum[..., num_bins:].square()


class MatrixLogMel:
    """WhisperFeatureExtractor's log-mel frames for a list of clips, computed on `device` without cuFFT."""

    def __init__(self, extractor: WhisperFeatureExtractor, device: torch.device) -> None:
        if extractor.dither != 0.0:
            raise ValueError(f"dither {extractor.dither}: only the extractor itself adds its noise")
        self.n_fft, self.hop = extractor.n_fft, extractor.hop_length
        self.device = device
        # The extractor's window is float32: the same values, widened in the basis.
        self.basis = dft_basis(torch.hann_window(self.n_fft)).to(device)
        self.mel_filters = torch.from_numpy(np.asarray(extractor.mel_filters)).double().to(device)

    def __call__(self, clips: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """Each clip's frames [mel bins, frames] (float32, on the host): the extractor's, and as many as its
        attention mask counts, for the clips padded together. Each clip needs more than n_fft // 2 samples."""
        longest = max(len(clip) for clip in clips)
        signal = torch.zeros(len(clips), longest, dtype=torch.float64)
        for row, clip in enumerate(clips):
            signal[row, :len(clip)] = torch.from_numpy(np.asarray(clip, dtype=np.float32))
        half = self.n_fft // 2
        padded = F.pad(signal.to(self.device)[:, None], (half, half), mode="reflect")[:, 0]
        num_frames = longest // self.hop  # the transform's 1 + longest // hop, less the last
        power = short_time_power(padded, self.basis, self.hop)[:, :num_frames]
        log_spec = (power @ self.mel_filters).clamp(min=1e-10).log10()
        peak = log_spec.amax(dim=(1, 2), keepdim=True)
        features = ((torch.maximum(log_spec, peak - 8.0) + 4.0) / 4.0).transpose(1, 2).float().cpu()
        # The extractor's mask keeps every hop-th sample of the clip's, less the transform's last frame.
        counts = [min(-(-len(clip) // self.hop), num_frames) for clip in clips]
        return [features[row, :, :count] for row, count in enumerate(counts)]
