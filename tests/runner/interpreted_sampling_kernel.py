"""Checks of the sampling kernel for Triton's interpreter, which must be on before Triton is imported:
`test_sampling_kernel` runs them in a process of its own with TRITON_INTERPRET=1. The interpreter has no
libdevice, so there the kernel's log is the interpreter's own (numpy's float32 log), and the torch chain it is
held to takes its Gumbel noise through the same log. On a GPU, `tests/gpu/test_sampling_cuda.py` holds the
libdevice log to torch's."""

from __future__ import annotations

import types

import numpy as np
import torch
import triton
import triton.language as tl

from tests.runner.codebook0_case import Codebook0Case
from tts_service.runner import sampling_kernel
from tts_service.runner.sampling import RowSampling, sample_eager, uniform_noise


@triton.jit
def _interpreter_log(x):
    return tl.log(x)


def _numpy_gumbel_noise(seeds: torch.Tensor, draws: torch.Tensor, vocab: int) -> torch.Tensor:
    """`sampling.gumbel_noise` with numpy's float32 log in place of torch's."""
    uniform = uniform_noise(seeds, draws, vocab).numpy()
    return torch.from_numpy(-np.log(-np.log(uniform)))


def check_the_kernel_draws_what_the_chain_draws(vocab: int) -> None:
    """Rows with suppressed ids and many tied scores, every temperature/top-k edge (greedy, k = 1, k past the
    vocabulary), seeds and draw indices over their whole ranges; top_p = 1, where the draws must be equal; and
    each row of the embedding table the kernel copies for its draw."""
    sampling_kernel.libdevice = types.SimpleNamespace(log=_interpreter_log)
    batch = 96
    generator = torch.Generator().manual_seed(vocab)
    scores = (4 * torch.randn(batch, vocab, generator=generator)).round() / 4
    scores[:, vocab - 100:] = float("-inf")
    scores[::7, : vocab // 2] = float("-inf")
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3]).repeat(batch // 4)
    top_k = torch.tensor([0, 1, 50, vocab, 3, 2 * vocab]).repeat(batch // 6)
    rows = RowSampling(temperature, top_k, torch.ones(batch))
    seeds = torch.randint(0, 2**62, (batch,), generator=generator)
    draws = torch.randint(0, 2**31, (batch,), generator=generator)
    table = torch.randn(vocab, 48, generator=generator).bfloat16()
    drawn, embedded = sampling_kernel.sample_and_embed_rows(scores, rows.temperature, rows.top_k, rows.top_p, seeds,
                                                            draws, table)
    expected = sample_eager(scores, rows, _numpy_gumbel_noise(seeds, draws, vocab))
    assert torch.equal(drawn, expected), (drawn != expected).nonzero().flatten().tolist()
    # Each program copies its own draw's row of the table, the next call's input; without a table, the same draws.
    assert torch.equal(embedded, table[expected])
    assert torch.equal(sampling_kernel.sample_rows(scores, rows.temperature, rows.top_k, rows.top_p, seeds, draws),
                       expected)
    # The noise decided most of the draws: greedy rows alone would pass a kernel that ignored it.
    assert (drawn != scores.argmax(dim=-1)).sum() > batch // 4


def check_the_codebook0_kernel_draws_what_the_chain_draws(vocab: int) -> None:
    """`Codebook0Case`'s rows: the kernel's ids, `seen` rows and embeddings are the chain's (its noise through
    numpy's log, as the interpreter's kernel takes it)."""
    sampling_kernel.libdevice = types.SimpleNamespace(log=_interpreter_log)
    case = Codebook0Case.random(vocab, torch.device("cpu"))
    case.check(lambda seeds, draws: _numpy_gumbel_noise(seeds, draws, vocab))


def check_greedy_draws_over_nan_scores_are_the_chains_and_in_the_vocabulary(vocab: int) -> None:
    """Greedy rows whose scores hold a NaN (one, or all of them): the kernel draws the NaN's column, as torch's
    argmax (the chain) does, never one past the vocabulary, and copies that row of the table."""
    sampling_kernel.libdevice = types.SimpleNamespace(log=_interpreter_log)
    batch = 8
    generator = torch.Generator().manual_seed(vocab)
    scores = torch.randn(batch, vocab, generator=generator)
    scores[1, : vocab // 2] = float("-inf")
    columns = torch.randint(0, vocab, (batch,), generator=generator)
    scores[torch.arange(batch), columns] = float("nan")
    scores[0] = float("nan")
    rows = RowSampling(torch.zeros(batch), torch.zeros(batch, dtype=torch.int64), torch.ones(batch))
    seeds = torch.zeros(batch, dtype=torch.int64)
    draws = torch.zeros(batch, dtype=torch.int64)
    table = torch.randn(vocab, 48, generator=generator).bfloat16()
    drawn, embedded = sampling_kernel.sample_and_embed_rows(scores, rows.temperature, rows.top_k, rows.top_p, seeds,
                                                            draws, table)
    expected = scores.argmax(dim=-1)
    assert expected[0] == 0 and torch.equal(expected[1:], columns[1:])
    assert torch.equal(drawn, expected), (drawn, expected)
    assert torch.equal(embedded, table[expected])
