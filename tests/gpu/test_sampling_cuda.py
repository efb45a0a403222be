"""Sampling on a GPU: a frame's 15 draws of noise made at once give each draw's own noise bit for bit, and the
sampling kernels, which make each row's noise themselves, draw what the torch chain draws with `gumbel_noise`
(the codebook-0 kernel also penalising, blocking and suppressing as the chain does)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tests.runner.codebook0_case import Codebook0Case
from tts_service.model.kernel_policy import KernelPolicy
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


@dataclass
class Rows:
    scores: torch.Tensor
    sampling: RowSampling
    seeds: torch.Tensor
    draws: torch.Tensor

    def kernel_draws(self) -> torch.Tensor:
        assert KernelPolicy.sampling_kernel(self.scores)
        rows = self.sampling
        return sampling_kernel.sample_rows(self.scores, rows.temperature, rows.top_k, rows.top_p, self.seeds,
                                           self.draws)

    def chain_draws(self) -> torch.Tensor:
        return sample_eager(self.scores, self.sampling, gumbel_noise(self.seeds, self.draws, self.scores.shape[1]))


def random_rows(batch: int, vocab: int, seed: int, top_p: float) -> Rows:
    """Scores with suppressed ids and many ties (rounded to quarters), a mix of every parameter's edge cases, and
    seeds and draw indices over their whole ranges."""
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
    return Rows(scores, rows, seeds, draws)


@pytest.mark.parametrize("vocab", [2048, 3072])
def test_the_sampling_kernel_draws_what_the_torch_chain_draws_without_top_p(vocab: int) -> None:
    rows = random_rows(512, vocab, seed=vocab, top_p=1.0)
    assert torch.equal(rows.kernel_draws(), rows.chain_draws())


def test_the_kernels_noise_is_the_chains_where_only_the_noise_decides() -> None:
    """Equal scores and no filter: each draw is the argmax of the noise alone, over 4,096 rows whose seeds and
    draw indices include 0 and the largest values requests use (and the draw indices as strided views, as the
    code predictor passes them)."""
    device = torch.device("cuda")
    batch, vocab = 4096, 2048
    seeds = torch.cat((torch.tensor([0, 2**32 - 1, 2**62], device=device),
                       torch.randint(0, 2**32, (batch - 3,), device=device)))
    frame_draws = torch.randint(0, 2**20, (batch, 15), device=device)
    frame_draws[:3] = torch.tensor([0, 2**31 - 1, 1], device=device)[:, None]
    uniform = RowSampling(torch.ones(batch, device=device), torch.zeros(batch, dtype=torch.int64, device=device),
                          torch.ones(batch, device=device))
    rows = Rows(torch.zeros(batch, vocab, device=device), uniform, seeds, frame_draws[:, 4])
    assert not rows.draws.is_contiguous()
    assert torch.equal(rows.kernel_draws(), rows.chain_draws())


def test_the_sampling_kernels_top_p_cut_matches_the_torch_chain_away_from_float_ties() -> None:
    """Continuous scores, so no token's cumulative mass sits within rounding of the cut (see sampling_kernel)."""
    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(11)
    scores = 3 * torch.randn(512, 2048, generator=generator, device=device)
    for top_p in (0.3, 0.8, 0.95):
        rows = RowSampling(torch.full((512,), 0.9, device=device),
                           torch.tensor([0, 50], device=device).repeat(256), torch.full((512,), top_p, device=device))
        drawn = Rows(scores, rows, torch.arange(512, device=device), torch.zeros(512, dtype=torch.int64, device=device))
        assert torch.equal(drawn.kernel_draws(), drawn.chain_draws()), f"top_p {top_p}"


def test_the_sampling_kernel_never_draws_a_removed_token() -> None:
    """Rows where all but 16 tokens are removed, so the noise decides among few kept tokens and many removed."""
    rows = random_rows(2048, 2048, seed=3, top_p=0.9)
    rows.scores[:, 16:2048 - 100] = float("-inf")
    rows.scores[::7, :16] = 0.0  # random_rows removed these rows' first half
    got = rows.kernel_draws()
    assert bool((got < 16).all())
    assert bool(torch.isfinite(rows.scores.gather(1, got[:, None])).all())


def test_the_codebook0_kernel_penalises_blocks_suppresses_and_draws_as_the_chain_does_on_the_gpu() -> None:
    case = Codebook0Case.random(3072, torch.device("cuda"))
    case.check(lambda seeds, draws: gumbel_noise(seeds, draws, 3072))


def test_a_greedy_draw_over_nan_scores_is_torchs_and_never_past_the_vocabulary_on_the_gpu() -> None:
    """Triton's argmax keeps a -inf (the padding past the vocabulary) over a NaN; the kernel's greedy draw takes
    the NaN's column, as torch's argmax does."""
    device = torch.device("cuda")
    batch, vocab = 8, 3072
    generator = torch.Generator(device=device).manual_seed(0)
    scores = torch.randn(batch, vocab, generator=generator, device=device)
    columns = torch.randint(0, vocab, (batch,), generator=generator, device=device)
    scores[torch.arange(batch, device=device), columns] = float("nan")
    scores[0] = float("nan")
    zeros = torch.zeros(batch, dtype=torch.int64, device=device)
    drawn = sampling_kernel.sample_rows(scores, torch.zeros(batch, device=device), zeros,
                                        torch.ones(batch, device=device), zeros, zeros)
    assert torch.equal(drawn, scores.argmax(dim=-1)) and int(drawn.max()) < vocab
