"""The forced aligner's log-mel frames on a GPU, with the short-time Fourier transform as one matrix product.

transformers' WhisperFeatureExtractor computes them with `torch.stft`, which on a GPU runs cuFFT through plans that
PyTorch caches by shape, so every new clip length makes a plan. Under word-timestamp load, with the aligner's kernels
held to 16 SMs beside the engine's frames, cuFFT's `regular_fft_r2c` kernel faulted with an illegal address (the CUDA
core dump named it; BENCHMARKS.md, "A fault under word-timestamp load"). Here each frame's transform is a product
with a fixed basis (the window times cosines and sines), so the path holds no plans, no cuFFT, and only cuBLAS
products, in float64: no TF32 setting can round it, and the values are the extractor's to float32 rounding
(tests/model/test_log_mel.py). On the host the aligner keeps the extractor itself, bitwise the reference's.

The steps are the extractor's for clips padded together (`padding=True`, zeros): frames centred by reflecting each
edge by half a window, a periodic Hann window, the power of each bin, the last frame dropped, the mel filters, log10
clamped at 1e-10, floored at 8 below the clip's peak (over its padded frames), then (x + 4) / 4.
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


class MatrixLogMel:
    """WhisperFeatureExtractor's log-mel frames for a list of clips, computed on `device` without cuFFT."""

    def __init__(self, extractor: WhisperFeatureExtractor, device: torch.device) -> None:
        if extractor.dither != 0.0:
            raise ValueError(f"dither {extractor.dither}: only the extractor itself adds its noise")
        self.n_fft, self.hop = extractor.n_fft, extractor.hop_length
        self.num_bins = self.n_fft // 2 + 1
        self.device = device
        # The extractor's window is float32: the same values, widened.
        window = torch.hann_window(self.n_fft).double()
        # (n * k) mod n_fft first, so that the angles are exact multiples of 2 pi / n_fft.
        turns = torch.outer(torch.arange(self.n_fft), torch.arange(self.num_bins)) % self.n_fft
        angles = turns.double() * (2 * math.pi / self.n_fft)
        self.basis = torch.cat([window[:, None] * torch.cos(angles), window[:, None] * torch.sin(angles)],
                               dim=1).to(device)
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
        frames = padded.unfold(-1, self.n_fft, self.hop)[:, :num_frames]
        spectrum = frames @ self.basis
        power = spectrum[..., :self.num_bins].square() + spectrum[..., self.num_bins:].square()
        log_spec = (power @ self.mel_filters).clamp(min=1e-10).log10()
        peak = log_spec.amax(dim=(1, 2), keepdim=True)
        features = ((torch.maximum(log_spec, peak - 8.0) + 4.0) / 4.0).transpose(1, 2).float().cpu()
        # The extractor's mask keeps every hop-th sample of the clip's, less the transform's last frame.
        counts = [min(-(-len(clip) // self.hop), num_frames) for clip in clips]
        return [features[row, :, :count] for row, count in enumerate(counts)]
