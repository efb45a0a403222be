"""The one dispatch policy: each threshold and flag it decides by, every kernel defined at module level, the kernel
modules importable without Triton (every path then off), and an eager path that imports no runner kernel."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tts_service.model import kernel_policy
from tts_service.model.kernel_policy import (
    MAX_ONE_CHANNEL_INPUTS,
    MAX_PREDICTOR_PASS_ROWS,
    MAX_SAMPLING_VOCAB,
    MAX_WINDOW_CHUNK,
    KernelPolicy,
)

ROOT = Path(__file__).resolve().parents[2]
CUDA = torch.device("cuda")
KERNEL_MODULES = ("tts_service.model.fused_ops", "tts_service.model.row_projections",
                  "tts_service.runner.sampling_kernel", "tts_service.runner.kv_cache",
                  "tts_service.runner.predictor_pass")


class OnCuda:
    """A CPU tensor that says it is on CUDA: the per-call rules read only a tensor's device flag and layout."""

    is_cuda = True

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tensor, name)


def on_cuda(*shape: int, dtype: torch.dtype = torch.bfloat16) -> Any:
    return OnCuda(torch.zeros(*shape, dtype=dtype))


@pytest.fixture(autouse=True)
def triton_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decide as a process with Triton and a Hopper GPU would, whatever this one has."""
    monkeypatch.setattr(kernel_policy, "HAS_TRITON", True)
    monkeypatch.setattr(kernel_policy, "launches_early", lambda device: device.type == "cuda")


def test_the_flags_device_and_dtype_decide_the_paths_of_a_run() -> None:
    full = KernelPolicy.build(CUDA, torch.bfloat16)
    assert full.kernels and full.fused and full.predictor_pass
    no_fused = KernelPolicy.build(CUDA, torch.bfloat16, use_fused_kernels=False)
    # The attention and sampling kernels follow Triton and the device alone; the predictor pass needs fused layers.
    assert no_fused.kernels and not no_fused.fused and not no_fused.predictor_pass
    no_predictor = KernelPolicy.build(CUDA, torch.bfloat16, use_predictor_kernel=False)
    assert no_predictor.fused and not no_predictor.predictor_pass
    fp32 = KernelPolicy.build(CUDA, torch.float32)
    assert fp32.fused and not fp32.predictor_pass
    cpu = KernelPolicy.build("cpu", torch.bfloat16)
    assert not (cpu.kernels or cpu.fused or cpu.predictor_pass)


def test_the_active_paths_say_what_the_run_takes() -> None:
    paths = KernelPolicy.build(CUDA, torch.float32).active_paths(decode_attention=True, predictor_pass=False)
    assert paths == {"device": "cuda", "dtype": "float32", "triton": True, "fused_layers": True,
                     "row_projections_at_1_2_rows": False, "paged_decode_attention": True,
                     "predictor_pass_at_1_2_rows": False, "sampling_kernels": True,
                     "programmatic_dependent_launch": True}
    cpu = KernelPolicy.build("cpu", torch.bfloat16).active_paths(decode_attention=False, predictor_pass=False)
    assert not any(value for key, value in cpu.items() if key not in ("device", "dtype", "triton"))


def test_the_paths_taken_name_the_fused_paths_on_and_not_triton_being_importable() -> None:
    paths = KernelPolicy.build(CUDA, torch.float32).active_paths(decode_attention=True, predictor_pass=False)
    assert KernelPolicy.paths_taken(paths) == ("fused_layers", "paged_decode_attention", "sampling_kernels",
                                               "programmatic_dependent_launch")
    cpu = KernelPolicy.build("cpu", torch.bfloat16).active_paths(decode_attention=False, predictor_pass=False)
    assert KernelPolicy.paths_taken(cpu) == ()


@pytest.mark.parametrize(("num_rows", "expected"), [(0, False), (1, True), (MAX_PREDICTOR_PASS_ROWS, True),
                                                    (MAX_PREDICTOR_PASS_ROWS + 1, False)])
def test_the_predictor_pass_serves_one_or_two_rows(num_rows: int, expected: bool) -> None:
    assert KernelPolicy.predictor_pass_rows(num_rows) is expected


@pytest.mark.parametrize(("num_rows", "expected"), [(1, True), (2, True), (3, False)])
@pytest.mark.parametrize("kind", ["normed", "gated", "plain"])
def test_the_row_projections_serve_one_or_two_rows(kind: str, num_rows: int, expected: bool) -> None:
    assert KernelPolicy.row_projection_kernel(on_cuda(num_rows, 1, 256), on_cuda(128, 256), kind) is expected


def test_the_row_projections_need_half_precision_cuda_and_widths_their_tiles_divide() -> None:
    weight = on_cuda(128, 256)
    assert not KernelPolicy.row_projection_kernel(on_cuda(1, 256, dtype=torch.float32),
                                                  on_cuda(128, 256, dtype=torch.float32), "plain")
    assert not KernelPolicy.row_projection_kernel(torch.zeros(1, 256, dtype=torch.bfloat16), weight, "plain")
    assert not KernelPolicy.row_projection_kernel(on_cuda(1, 256), on_cuda(130, 256), "plain")  # 4 rows a tile
    transposed = OnCuda(torch.zeros(256, 128, dtype=torch.bfloat16).T)
    assert not KernelPolicy.row_projection_kernel(on_cuda(1, 256), transposed, "plain")


@pytest.mark.parametrize(("vocab", "expected"), [(3072, True), (MAX_SAMPLING_VOCAB, True),
                                                 (MAX_SAMPLING_VOCAB + 1, False)])
def test_the_sampling_kernels_take_at_most_8192_ids(vocab: int, expected: bool) -> None:
    assert KernelPolicy.sampling_kernel(on_cuda(4, vocab, dtype=torch.float32)) is expected
    assert KernelPolicy.codebook0_kernel(on_cuda(4, vocab)) is expected


def test_the_sampling_kernel_takes_fp32_rows_of_unit_stride_on_cuda() -> None:
    assert not KernelPolicy.sampling_kernel(on_cuda(4, 2048))
    assert not KernelPolicy.sampling_kernel(torch.zeros(4, 2048))
    assert not KernelPolicy.sampling_kernel(OnCuda(torch.zeros(2048, 4).T))
    assert not KernelPolicy.codebook0_kernel(OnCuda(torch.zeros(2048, 4).T))


@pytest.mark.parametrize(("head_dim", "dtype", "expected"), [(128, torch.bfloat16, True), (16, torch.float32, True),
                                                            (8, torch.bfloat16, False), (96, torch.bfloat16, False),
                                                            (128, torch.float64, False)])
def test_the_paged_attention_serves_power_of_two_heads_of_at_least_16(head_dim: int, dtype: torch.dtype,
                                                                      expected: bool) -> None:
    assert KernelPolicy.decode_attention_kernel(CUDA, dtype, head_dim) is expected
    assert not KernelPolicy.decode_attention_kernel(torch.device("cpu"), dtype, head_dim)


@pytest.mark.parametrize(("length", "dtype", "expected"), [(MAX_WINDOW_CHUNK, torch.float32, True),
                                                          (MAX_WINDOW_CHUNK + 1, torch.float32, False),
                                                          (1, torch.bfloat16, False)])
def test_the_codec_window_attention_takes_fp32_chunks_of_at_most_64_frames(length: int, dtype: torch.dtype,
                                                                           expected: bool) -> None:
    tables = (on_cuda(1, length, 64, dtype=dtype), on_cuda(1, length, 64, dtype=dtype))
    ring = (on_cuda(1, 2, 72, 64, dtype=dtype), on_cuda(1, 2, 72, 64, dtype=dtype))
    assert KernelPolicy.window_attention_kernel(on_cuda(1, length, 512, dtype=dtype), *tables, *ring) is expected


@pytest.mark.parametrize(("channels", "expected"), [(96, True), (MAX_ONE_CHANNEL_INPUTS, True),
                                                    (MAX_ONE_CHANNEL_INPUTS + 1, False)])
def test_the_one_channel_convolution_takes_at_most_256_inputs(channels: int, expected: bool) -> None:
    x, bias = on_cuda(1, 40, channels, dtype=torch.float32), on_cuda(1, dtype=torch.float32)
    assert KernelPolicy.one_channel_convolution_kernel(x, on_cuda(1, channels, 7, dtype=torch.float32),
                                                       bias) is expected
    assert not KernelPolicy.one_channel_convolution_kernel(x, on_cuda(2, channels, 7, dtype=torch.float32), bias)
    assert not KernelPolicy.one_channel_convolution_kernel(x, on_cuda(1, channels, 7, dtype=torch.float32), None)


def test_qk_norm_rope_takes_packed_heads_of_a_power_of_two_size_evenly_spaced() -> None:
    def rope(length: int, head_dim: int) -> tuple[Any, Any]:
        return on_cuda(2, length, head_dim), on_cuda(2, length, head_dim)

    q_width, kv_width = 8 * 64, 2 * 64
    qkv = OnCuda(torch.zeros(2, 3, q_width + 2 * kv_width, dtype=torch.bfloat16))
    q, k, _ = qkv.tensor.split((q_width, kv_width, kv_width), -1)
    q, k = OnCuda(q.view(2, 3, 8, 64)), OnCuda(k.view(2, 3, 2, 64))
    weight = on_cuda(64)
    assert KernelPolicy.qk_norm_rope_kernel(q, k, weight, weight, *rope(3, 64))
    odd = on_cuda(2, 3, 8, 48)
    assert not KernelPolicy.qk_norm_rope_kernel(odd, on_cuda(2, 3, 2, 48), on_cuda(48), on_cuda(48), *rope(3, 48))
    uneven = OnCuda(torch.zeros(3, 2, 8, 64, dtype=torch.bfloat16).transpose(0, 1))  # tokens not evenly spaced
    assert not KernelPolicy.qk_norm_rope_kernel(uneven, uneven, weight, weight, *rope(3, 64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_elementwise_kernels_take_unit_stride_rows_of_one_dtype(dtype: torch.dtype) -> None:
    x, weight = on_cuda(2, 3, 256, dtype=dtype), on_cuda(256, dtype=dtype)
    assert KernelPolicy.rms_norm_kernel(x, weight) and KernelPolicy.add_rms_norm_kernel(x, x, weight)
    assert KernelPolicy.silu_mul_kernel(x, x)
    assert not KernelPolicy.rms_norm_kernel(x, on_cuda(256, dtype=torch.float64))
    assert not KernelPolicy.rms_norm_kernel(OnCuda(torch.zeros(256, 3, dtype=dtype).T), weight)
    assert not KernelPolicy.rms_norm_kernel(x.tensor, weight)
    assert not KernelPolicy.silu_mul_kernel(x, on_cuda(2, 3, 128, dtype=dtype))


def test_without_triton_no_call_takes_a_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_policy, "HAS_TRITON", False)
    x = on_cuda(1, 1, 256)
    assert not KernelPolicy.build(CUDA, torch.bfloat16).kernels
    assert not KernelPolicy.rms_norm_kernel(x, on_cuda(256))
    assert not KernelPolicy.row_projection_kernel(x, on_cuda(128, 256), "plain")
    assert not KernelPolicy.sampling_kernel(on_cuda(1, 2048, dtype=torch.float32))
    assert not KernelPolicy.decode_attention_kernel(CUDA, torch.bfloat16, 128)


def test_every_kernel_is_defined_at_module_level() -> None:
    nested = []
    for path in sorted((ROOT / "tts_service").rglob("*.py")):
        tree = ast.parse(path.read_text())
        top_level = {id(node) for node in tree.body}
        nested += [f"{path.relative_to(ROOT)}:{node.lineno}" for node in ast.walk(tree)
                   if isinstance(node, ast.FunctionDef) and id(node) not in top_level
                   and any(ast.unparse(decorator) == "triton.jit" for decorator in node.decorator_list)]
    assert nested == []


# A meta-path finder that raises would also break the find_spec probes that transformers makes for every optional
# package; None in sys.modules is what import reads as "not installed" and find_spec as absent.
WITHOUT_TRITON = f"""
import importlib, sys
sys.modules["triton"] = None
import torch
from tts_service.model import fused_ops
from tts_service.model.kernel_policy import KernelPolicy
from tts_service.model.triton_utils import HAS_TRITON, TritonMissingError
for name in {KERNEL_MODULES!r}:
    importlib.import_module(name)
import tts_service.runner.runner, tts_service.engine.engine, tts_service.eager.synthesize
assert not HAS_TRITON
paths = KernelPolicy.build("cuda", torch.bfloat16).active_paths(decode_attention=False, predictor_pass=False)
assert not any(value for key, value in paths.items() if key not in ("device", "dtype")), paths
x = torch.randn(2, 8)
assert torch.equal(fused_ops.rms_norm(x, torch.ones(8), 1e-6), fused_ops.rms_norm_eager(x, torch.ones(8), 1e-6))
try:
    fused_ops._rms_norm_kernel[(1,)](x)
except TritonMissingError:
    pass
else:
    raise AssertionError("a kernel launched without Triton")
"""


def test_every_kernel_module_imports_without_triton_and_every_path_is_off() -> None:
    result = subprocess.run([sys.executable, "-c", WITHOUT_TRITON], cwd=ROOT, env={**os.environ},
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]


def test_the_eager_path_imports_no_runner_kernel() -> None:
    """The baseline the runner's kernels are held to: its sampling is the torch chain (`sampling.TORCH_SAMPLER`)."""
    code = ("import sys, tts_service.eager.synthesize; "
            f"print([name for name in {KERNEL_MODULES!r} if name.startswith('tts_service.runner') "
            "and name in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            check=True)
    assert result.stdout.strip() == "[]"
