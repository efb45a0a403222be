"""Checks run under Triton's interpreter. It must be on before Triton is imported (Triton's own library functions
are kernels too), so each check runs in a fresh Python process with TRITON_INTERPRET=1."""

from __future__ import annotations

import os
import subprocess
import sys


def run_interpreted(module: str, check: str, *args: int) -> None:
    """Call `module.check(*args)` in an interpreter process; its failure (an assertion, an error) fails the caller."""
    code = f"from {module} import {check}; {check}(*{args!r})"
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRITON_INTERPRET": "1"},
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
