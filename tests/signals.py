"""Test audio: deterministic signals with some spectral movement, so encoders see more than a tone."""

from __future__ import annotations

import numpy as np


def sweep_signal(num_samples: int = 72000, seed: int = 0, base_hz: float = 200.0,
                 sample_rate: int = 24000) -> np.ndarray:
    """Two sine sweeps and a little noise, float32, deterministic for a seed."""
    rng = np.random.default_rng(seed)
    t = np.arange(num_samples) / sample_rate
    rising = 0.3 * np.sin(2 * np.pi * (base_hz * t + 300 * t**2))
    falling = 0.2 * np.sin(2 * np.pi * (1500 * t - 100 * t**2))
    return (rising + falling + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)
