"""The sampling kernel on the CPU, through Triton's interpreter (in a process of its own, see
`interpreted_sampling_kernel`): it draws what the torch chain draws."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")


@pytest.mark.parametrize("vocab", [2048, 3072])
def test_the_sampling_kernel_draws_what_the_torch_chain_draws_in_the_interpreter(vocab: int) -> None:
    code = ("from tests.runner.interpreted_sampling_kernel import check_the_kernel_draws_what_the_chain_draws; "
            f"check_the_kernel_draws_what_the_chain_draws({vocab})")
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRITON_INTERPRET": "1"},
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
