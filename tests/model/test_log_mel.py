"""The aligner's log-mel frames as a matrix product (its path on a GPU, here run on the host) are the frames
transformers' WhisperFeatureExtractor gives, to float32 rounding, and as many as its attention mask counts: for a
clip alone, for clips padded together, at the shortest clip the aligner lets through, and at lengths on and off the
hop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor

from tts_service.model.aligner_random import _PREPROCESSOR
from tts_service.model.log_mel import MatrixLogMel

# Log-mel values lie within about [-1, 3]; the extractor's float32 transform rounds to about 1e-6 of that.
ATOL = 1e-5


@pytest.fixture(scope="module")
def extractor() -> WhisperFeatureExtractor:
    return WhisperFeatureExtractor.from_dict(dict(_PREPROCESSOR))


def the_extractors_frames(extractor: WhisperFeatureExtractor, clips: list[np.ndarray]) -> list[torch.Tensor]:
    extracted = extractor(clips, sampling_rate=16000, padding=True, truncation=False, return_attention_mask=True,
                          return_tensors="pt", device="cpu")
    counts = extracted["attention_mask"].sum(-1).tolist()
    return [extracted["input_features"][row, :, :count] for row, count in enumerate(counts)]


@pytest.mark.parametrize("lengths", [[16000], [201], [160 * 7], [52805], [16050, 8000], [3333, 48000, 1120, 201]])
def test_frames_are_the_extractors(extractor: WhisperFeatureExtractor, lengths: list[int]) -> None:
    rng = np.random.default_rng(len(lengths))
    # Speech-like levels, and one near silence, where the floor at 8 below the peak decides the values.
    clips = [rng.standard_normal(length).astype(np.float32) * scale
             for length, scale in zip(lengths, [0.1, 0.5, 1e-4, 0.02], strict=False)]
    ours = MatrixLogMel(extractor, torch.device("cpu"))(clips)
    for mine, theirs in zip(ours, the_extractors_frames(extractor, clips), strict=True):
        assert mine.dtype == torch.float32 and mine.shape == theirs.shape
        torch.testing.assert_close(mine, theirs, rtol=0.0, atol=ATOL)


def test_a_pure_tone_peaks_in_its_bin_and_the_rest_floors_as_the_extractors(
        extractor: WhisperFeatureExtractor) -> None:
    """1 kHz at 16 kHz lands in the mel bin whose filter peaks there (a check that does not lean on the extractor),
    and the bins far from it, more than 8 decades down, take the floor below the peak as the extractor's do."""
    tone = np.sin(2 * np.pi * 1000 * np.arange(16000) / 16000).astype(np.float32)
    (frames,) = MatrixLogMel(extractor, torch.device("cpu"))([tone])
    filters = np.asarray(extractor.mel_filters)  # [frequency bins, mel bins]
    tone_bin = round(1000 * extractor.n_fft / 16000)
    assert int(frames[:, 50].argmax()) == int(filters[tone_bin].argmax())
    (theirs,) = the_extractors_frames(extractor, [tone])
    assert bool((theirs == theirs.min()).any())  # the floor is reached
    torch.testing.assert_close(frames, theirs, rtol=0.0, atol=ATOL)


def test_an_extractor_that_adds_noise_is_refused(extractor: WhisperFeatureExtractor) -> None:
    noisy = WhisperFeatureExtractor.from_dict({**_PREPROCESSOR, "dither": 1e-5})
    with pytest.raises(ValueError, match="dither"):
        MatrixLogMel(noisy, torch.device("cpu"))
