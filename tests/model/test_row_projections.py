"""The one- and two-row projection kernels on the CPU, through Triton's interpreter."""

from __future__ import annotations

import pytest

from tests.runner.triton_interpreter import run_interpreted

pytest.importorskip("triton")


@pytest.mark.parametrize("num_rows", [1, 2])
@pytest.mark.parametrize("chunk", [64, 256], ids=["four-steps-a-row", "one-step-a-row"])
def test_the_row_projections_give_the_eager_chains_values_in_the_interpreter(num_rows: int, chunk: int) -> None:
    run_interpreted("tests.model.interpreted_row_projections", "check_the_projections_give_the_chains_values",
                    num_rows, chunk)
