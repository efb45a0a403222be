"""Sampling on a GPU: a frame's 15 draws of noise made at once give each draw's own noise bit for bit, and the
sampling kernel draws what the torch chain draws."""

from __future__ import annotations

import pytest
import torch

from tts_service.runner import sampling_kernel
from tts_service.runner.sampling import RowSampling, gumbel_noise, sample_eager

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("batch", [1, 128])
def test_a_frames_draws_made_at_once_equal_each_draw_made_alone_on_the_gpu(batch: int) -> None:
    device = torch.device("cuda")
    seeds = torch.randint(0, 2**62, (batch,), device=device)
    draws = torch.randint(0, 2**31, (batch,), device=device)[:, None] + torch.arange(1, 16, device=device)
    together = gumbel_noise(seeds, draws, 2048)
    for index in range(15):
        assert torch.equal(together[:, index], gumbel_noise(seeds, draws[:, index], 2048))


def random_rows(batch: int, vocab: int, seed: int, top_p: float) -> tuple[torch.Tensor, RowSampling, torch.Tensor]:
    """Scores with suppressed ids and many ties (rounded to quarters), and a mix of every parameter's edge cases."""
    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(seed)
    scores = (4 * torch.randn(batch, vocab, generator=generator, device=device)).round() / 4
    scores[:, vocab - 100:] = float("-inf")
    scores[::7, : vocab // 2] = float("-inf")
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3], device=device).repeat(batch // 4 + 1)[:batch]
    top_k = torch.tensor([0, 1, 50, vocab, 3, 2 * vocab], device=device).repeat(batch // 6 + 1)[:batch]
    rows = RowSampling(temperature, top_k, torch.full((batch,), top_p, device=device))
    seeds = torch.randint(0, 2**62, (batch,), generator=generator, device=device)
    draws = torch.randint(0, 2**31, (batch,), generator=generator, device=device)
    return scores, rows, gumbel_noise(seeds, draws, vocab)


@pytest.mark.parametrize("vocab", [2048, 3072])
def test_the_sampling_kernel_draws_what_the_torch_chain_draws_without_top_p(vocab: int) -> None:
    scores, rows, gumbel = random_rows(512, vocab, seed=vocab, top_p=1.0)
    assert sampling_kernel.kernel_applies(scores, gumbel)
    got = sampling_kernel.sample_rows(scores, rows.temperature, rows.top_k, rows.top_p, gumbel)
    assert torch.equal(got, sample_eager(scores, rows, gumbel))


def test_the_sampling_kernels_top_p_cut_matches_the_torch_chain_away_from_float_ties() -> None:
    """Continuous scores, so no token's cumulative mass sits within rounding of the cut (see sampling_kernel)."""
    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(11)
    scores = 3 * torch.randn(512, 2048, generator=generator, device=device)
    for top_p in (0.3, 0.8, 0.95):
        rows = RowSampling(torch.full((512,), 0.9, device=device),
                           torch.tensor([0, 50], device=device).repeat(256), torch.full((512,), top_p, device=device))
        gumbel = gumbel_noise(torch.arange(512, device=device), torch.zeros(512, dtype=torch.int64, device=device),
                              2048)
        got = sampling_kernel.sample_rows(scores, rows.temperature, rows.top_k, rows.top_p, gumbel)
        assert torch.equal(got, sample_eager(scores, rows, gumbel)), f"top_p {top_p}"


def test_the_sampling_kernel_never_draws_a_removed_token() -> None:
    scores, rows, gumbel = random_rows(256, 2048, seed=3, top_p=0.9)
    gumbel[:, 2048 - 100:] = 1e6  # the largest noise sits on suppressed ids
    got = sampling_kernel.sample_rows(scores, rows.temperature, rows.top_k, rows.top_p, gumbel)
    assert bool((got < 2048 - 100).all())
    assert bool(torch.isfinite(scores.gather(1, got[:, None])).all())
