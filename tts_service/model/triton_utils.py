"""Triton, or a stand-in where it is not installed, so that every kernel module defines its kernels at module level.

The CPU build and CI have no Triton, and the eager chains need none. Importing `triton`, `tl`, `libdevice` and the
programmatic-launch intrinsics from here instead of from Triton lets a kernel module import anywhere: without
Triton, `@triton.jit` keeps the function as a kernel that cannot launch, and launching it (or calling any other
Triton function) raises `TritonMissingError`. `kernel_policy.KernelPolicy` never picks a kernel then, so the
error means a caller went around the policy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NoReturn

import torch


class TritonMissingError(RuntimeError):
    """A Triton kernel or function was called in a process where Triton is not installed."""


def _missing(name: str, *args: Any, **kwargs: Any) -> NoReturn:
    raise TritonMissingError(f"{name} needs Triton, which is not installed: the eager chain is the path without it")


class _StandInKernel:
    """What `triton.jit` makes of a kernel without Triton: defined, named, never launched."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid: Any) -> Callable[..., NoReturn]:
        return functools.partial(_missing, f"the kernel {self.fn.__name__}")

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        _missing(f"the kernel {self.fn.__name__}")


class _StandInModule:
    """A Triton module without Triton: the attributes a module's import reads (`jit`, `constexpr`) work, and any
    other is a function that raises when called."""

    def __init__(self, name: str, **working: Any) -> None:
        self._name = name
        self.__dict__.update(working)

    def __getattr__(self, attribute: str) -> Callable[..., NoReturn]:
        if attribute.startswith("__"):  # introspection (copy, pickle, inspect) then sees an ordinary object
            raise AttributeError(attribute)
        return functools.partial(_missing, f"{self._name}.{attribute}")


try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the environment; tests/model/test_kernel_policy.py runs it
    HAS_TRITON = False
    triton = _StandInModule("triton", jit=_StandInKernel)  # type: ignore[assignment]
    # Module-level constants of the kernel modules are constexprs; without Triton they stay plain values.
    tl = _StandInModule("triton.language", constexpr=lambda value: value)  # type: ignore[assignment]
    libdevice = _StandInModule("triton.language.extra.libdevice")  # type: ignore[assignment]
    gdc_launch_dependents = functools.partial(_missing, "gdc_launch_dependents")
    gdc_wait = functools.partial(_missing, "gdc_wait")


@functools.cache
def launches_early(device: torch.device) -> bool:
    """Whether kernels launch as programmatic dependents (Hopper and later): a kernel's programs may start while
    the kernel before it finishes, load what depends on no kernel, and wait for its outputs only then."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


__all__ = ["HAS_TRITON", "TritonMissingError", "gdc_launch_dependents", "gdc_wait", "launches_early", "libdevice",
           "tl", "triton"]
