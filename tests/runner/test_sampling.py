"""Sampling edge cases: the noise, removed tokens, and row independence."""

from __future__ import annotations

import torch

from tts_service.runner.params import SamplingParams
from tts_service.runner.sampling import RowSampling, gumbel_noise, sample, uniform_noise, unit_interval


def test_extreme_random_bits_stay_strictly_inside_the_unit_interval() -> None:
    bits = torch.tensor([0, 1, 0xFFFFFE00, 0xFFFFFFFF], dtype=torch.int64)
    noise = unit_interval(bits)
    assert bool(((noise > 0) & (noise < 1)).all())
    assert bool(torch.isfinite(-torch.log(-torch.log(noise))).all())


def test_a_removed_token_is_never_drawn_even_when_its_noise_is_the_largest() -> None:
    vocab = 64
    scores = torch.zeros(1, vocab)
    scores[0, 40:] = float("-inf")  # suppressed ids
    rows = RowSampling.from_params([SamplingParams(1.0, top_k=5)], torch.device("cpu"))
    drawn = [int(sample(scores, rows, torch.tensor([seed]), torch.tensor([0]))) for seed in range(2000)]
    assert max(drawn) < 40


def test_noise_of_a_row_depends_only_on_its_own_seed_and_draw() -> None:
    alone = uniform_noise(torch.tensor([7]), torch.tensor([3]), 100)
    batched = uniform_noise(torch.tensor([1, 7, 9]), torch.tensor([0, 3, 5]), 100)
    assert torch.equal(alone[0], batched[1])


def test_a_frames_draws_made_at_once_equal_each_draw_made_alone() -> None:
    seeds, first_draws = torch.tensor([3, 2**40 + 5, 11]), torch.tensor([0, 150, 2**31 + 7])
    draws = first_draws[:, None] + torch.arange(1, 16)
    together = gumbel_noise(seeds, draws, 2048)
    assert together.shape == (3, 15, 2048)
    for index in range(15):
        assert torch.equal(together[:, index], gumbel_noise(seeds, draws[:, index], 2048))
        assert torch.equal(uniform_noise(seeds, draws, 64)[:, index], uniform_noise(seeds, draws[:, index], 64))
