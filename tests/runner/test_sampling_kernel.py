"""The sampling kernel on the CPU, through Triton's interpreter (in a process of its own, see
`interpreted_sampling_kernel`): it draws what the torch chain draws."""

from __future__ import annotations

import pytest

from tests.runner.triton_interpreter import run_interpreted

pytest.importorskip("triton")


@pytest.mark.parametrize("vocab", [2048, 3072])
def test_the_sampling_kernel_draws_what_the_torch_chain_draws_and_copies_each_draws_embedding(vocab: int) -> None:
    run_interpreted("tests.runner.interpreted_sampling_kernel", "check_the_kernel_draws_what_the_chain_draws", vocab)


@pytest.mark.parametrize("vocab", [3072])
def test_the_codebook0_kernel_penalises_blocks_suppresses_and_draws_as_the_chain_does(vocab: int) -> None:
    run_interpreted("tests.runner.interpreted_sampling_kernel", "check_the_codebook0_kernel_draws_what_the_chain_draws",
                    vocab)


@pytest.mark.parametrize("vocab", [3072])
def test_a_greedy_draw_over_nan_scores_is_the_chains_and_never_past_the_vocabulary(vocab: int) -> None:
    run_interpreted("tests.runner.interpreted_sampling_kernel",
                    "check_greedy_draws_over_nan_scores_are_the_chains_and_in_the_vocabulary", vocab)
