"""The seeded noise on a GPU: a frame's 15 draws made at once give each draw's own noise, bit for bit."""

from __future__ import annotations

import pytest
import torch

from tts_service.runner.sampling import gumbel_noise

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("batch", [1, 128])
def test_a_frames_draws_made_at_once_equal_each_draw_made_alone_on_the_gpu(batch: int) -> None:
    device = torch.device("cuda")
    seeds = torch.randint(0, 2**62, (batch,), device=device)
    draws = torch.randint(0, 2**31, (batch,), device=device)[:, None] + torch.arange(1, 16, device=device)
    together = gumbel_noise(seeds, draws, 2048)
    for index in range(15):
        assert torch.equal(together[:, index], gumbel_noise(seeds, draws[:, index], 2048))
