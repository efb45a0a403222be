"""Which path runs, a Triton kernel or the eager chain beside it: every rule in one place.

Each kernel has an eager chain that computes the same values (its docstring says how its rounding compares;
docs/performance.md lists them all). A kernel runs only where all of these hold:
- Triton is importable and the tensors are on CUDA (the CPU, and a build without Triton, run the eager chains);
- the engine's flags leave it on: `use_fused_kernels` switches the model's layers and the codec to their fused
  kernels (`layers.use_fused_kernels`) and the code predictor to the paged memory, `use_predictor_kernel` the
  persistent predictor pass; the paged attention and the sampling kernels follow Triton and the device alone;
- the kernel covers the call: dtypes, strides and contiguity, widths its tiles divide, at most 8,192 ids for
  sampling (a row lives in one program's registers);
- it was measured faster there: the row projections and the predictor pass at one or two rows.

`KernelPolicy.build` takes the device, dtype and flags once (the runner's, at start); its properties answer what is
decided for the whole run, and `active_paths` says it. Its static methods decide per call from the call's tensors
alone: the flags have already decided which modules ask (a module switched off never does), so the model's modules
need no policy of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tts_service.model.row_projections import MAX_ROWS, chunk_for, default_tiling
from tts_service.model.triton_utils import HAS_TRITON, launches_early

_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_HALF_DTYPES = (torch.bfloat16, torch.float16)
# The longest chunk the codec's window-attention kernel takes; longer ones (a primed context) run eagerly.
MAX_WINDOW_CHUNK = 64
# The most input channels the one-output-channel convolution takes (they share one program's lanes).
MAX_ONE_CHANNEL_INPUTS = 256
# The largest vocabulary the sampling kernels take: one row lives in one program's registers.
MAX_SAMPLING_VOCAB = 8192
# The most rows (streams times tokens: a frame's first call holds two a stream) the predictor pass serves. Measured
# on an H100 (BENCHMARKS.md at 927abc4), codebooks 2-15 at 1.7B: 2.07 ms against the layer chain's 2.84 at one row,
# 2.55 against 2.85 at two, but 3.84 against 2.87 at four, where each row's reductions add up and the chain's
# projections are no longer starved of work. More rows keep the chain.
MAX_PREDICTOR_PASS_ROWS = 2


@dataclass(frozen=True)
class KernelPolicy:
    """The paths a runner's device, dtype and flags allow (decided once), and the per-call rules."""

    device: torch.device
    dtype: torch.dtype
    use_fused_kernels: bool = True
    use_predictor_kernel: bool = True

    @classmethod
    def build(cls, device: torch.device | str, dtype: torch.dtype, *, use_fused_kernels: bool = True,
              use_predictor_kernel: bool = True) -> KernelPolicy:
        return cls(torch.device(device), dtype, use_fused_kernels, use_predictor_kernel)

    # Decided once, for the whole run.

    @property
    def kernels(self) -> bool:
        """Whether any kernel may run: Triton importable and a CUDA device."""
        return KernelPolicy.runs_kernels(self.device)

    @property
    def fused(self) -> bool:
        """Whether the model's layers and the codec take their fused kernels (and pack their projections), and
        the code predictor keeps its keys and values in the paged memory the attention kernel reads."""
        return self.kernels and self.use_fused_kernels

    @property
    def predictor_pass(self) -> bool:
        """Whether the code predictor's calls of one or two rows run as one persistent kernel, where its memory is
        paged and its shapes are ones the kernel's tiles cover (`PredictorPass.covers`): half precision only."""
        return self.fused and self.use_predictor_kernel and self.dtype in _HALF_DTYPES

    def active_paths(self, *, decode_attention: bool, predictor_pass: bool) -> dict[str, bool | str]:
        """What this run takes, for the start-up log: the paths decided here, with the two that also depend on
        the model's shapes as the runner built them. Each fused path still falls back per call where a tensor
        does not fit its kernel, as the static rules below decide."""
        return {
            "device": self.device.type,
            "dtype": str(self.dtype).removeprefix("torch."),
            "triton": HAS_TRITON,
            "fused_layers": self.fused,
            "row_projections_at_1_2_rows": self.fused and self.dtype in _HALF_DTYPES,
            "paged_decode_attention": decode_attention,
            "predictor_pass_at_1_2_rows": predictor_pass,
            "sampling_kernels": self.kernels,
            "programmatic_dependent_launch": self.kernels and launches_early(self.device),
        }

    @staticmethod
    def paths_taken(paths: dict[str, bool | str]) -> tuple[str, ...]:
        """The fused paths on in `active_paths`' answer, for the build-info metric; "triton" says only that
        Triton is importable, which is no path taken."""
        return tuple(name for name, value in paths.items() if value is True and name != "triton")

    # Decided per call, from the call's tensors (or the device of the module or cache that asks).

    @staticmethod
    def runs_kernels(device: torch.device) -> bool:
        return HAS_TRITON and device.type == "cuda"

    @staticmethod
    def rms_norm_kernel(x: torch.Tensor, weight: torch.Tensor) -> bool:
        return _is_kernel_tensor(x) and weight.dtype == x.dtype

    @staticmethod
    def add_rms_norm_kernel(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> bool:
        return _is_kernel_tensor(x) and _is_kernel_tensor(residual) and weight.dtype == x.dtype == residual.dtype

    @staticmethod
    def qk_norm_rope_kernel(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                            cos: torch.Tensor, sin: torch.Tensor) -> bool:
        """Heads packed in each token, tokens evenly spaced (slices of a packed q/k/v projection qualify), one
        dtype, a power-of-two head size."""
        head_dim = q.shape[-1]
        return (_is_kernel_tensor(q) and _is_kernel_tensor(k) and q.dtype == k.dtype == q_weight.dtype
                == k_weight.dtype == cos.dtype == sin.dtype and head_dim & (head_dim - 1) == 0
                and q.stride(2) == head_dim and k.stride(2) == head_dim
                and token_stride(q) is not None and token_stride(k) is not None)

    @staticmethod
    def silu_mul_kernel(gate: torch.Tensor, up: torch.Tensor) -> bool:
        return _is_kernel_tensor(gate) and _is_kernel_tensor(up) and gate.dtype == up.dtype and gate.shape == up.shape

    @staticmethod
    def row_projection_kernel(x: torch.Tensor, weight: torch.Tensor, kind: str) -> bool:
        """Whether the `kind` kernel ("normed", "gated" or "plain") of `row_projections` serves activations like
        x [..., K] with weight [N, K]: at most MAX_ROWS rows, half precision, and widths its tiles divide."""
        num_rows = x.numel() // x.shape[-1] if x.dim() else 0
        if not (HAS_TRITON and x.is_cuda and 1 <= num_rows <= MAX_ROWS):
            return False
        tiling = default_tiling(kind, num_rows, weight.shape[1])
        out_width = weight.shape[0] // 2 if kind == "gated" else weight.shape[0]
        return (x.dtype in _HALF_DTYPES and weight.dtype == x.dtype and x.stride(-1) == 1
                and weight.dim() == 2 and weight.is_contiguous() and out_width % tiling.tile_rows == 0
                and weight.shape[1] % chunk_for(weight.shape[1], tiling) == 0)

    @staticmethod
    def snake_kernel(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor,
                     input_bias: torch.Tensor | None) -> bool:
        return (_is_snake_kernel_tensor(x, log_alpha, log_beta)
                and (input_bias is None or input_bias.dtype == log_alpha.dtype))

    @staticmethod
    def snake_after_history_kernel(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor,
                                   history: torch.Tensor, input_bias: torch.Tensor | None) -> bool:
        return (KernelPolicy.snake_kernel(x, log_alpha, log_beta, input_bias) and _is_kernel_tensor(history)
                and history.is_contiguous())

    @staticmethod
    def add_biased_kernel(x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor, x_bias: torch.Tensor | None) -> bool:
        return (_is_kernel_tensor(x) and _is_kernel_tensor(y) and x.is_contiguous() and y.is_contiguous()
                and x.shape == y.shape and x.dtype == bias.dtype and bias.is_contiguous()
                and (x_bias is None or (x_bias.dtype == x.dtype and x_bias.is_contiguous())))

    @staticmethod
    def window_attention_kernel(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, held_keys: torch.Tensor,
                                held_values: torch.Tensor) -> bool:
        """fp32 only (in bf16 the eager chain rounds every matmul's output, which the kernel does not),
        contiguous, and chunks of at most MAX_WINDOW_CHUNK frames (a long context is primed once, eagerly)."""
        tensors = (qkv, cos, sin, held_keys, held_values)
        return (_is_kernel_tensor(qkv) and all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors)
                and qkv.shape[1] <= MAX_WINDOW_CHUNK)

    @staticmethod
    def codebook_sum_kernel(codes: torch.Tensor, tables: torch.Tensor) -> bool:
        return _is_kernel_tensor(tables) and tables.is_contiguous() and codes.is_cuda and codes.dim() == 3

    @staticmethod
    def frame_embedding_kernel(frames: torch.Tensor, table: torch.Tensor, addend: torch.Tensor) -> bool:
        return (_is_kernel_tensor(table) and table.is_contiguous() and frames.is_cuda and frames.is_contiguous()
                and addend.dtype == table.dtype and addend.stride(-1) == 1)

    @staticmethod
    def one_channel_convolution_kernel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        """fp32, contiguous, one output channel and at most MAX_ONE_CHANNEL_INPUTS input channels (the codec's last
        layer: 96 channels to the waveform)."""
        return (_is_kernel_tensor(x) and x.dtype == torch.float32 and x.dim() == 3 and x.is_contiguous()
                and weight.dtype == torch.float32 and weight.dim() == 3 and weight.shape[0] == 1
                and weight.shape[1] == x.shape[2] <= MAX_ONE_CHANNEL_INPUTS and weight.is_contiguous()
                and bias is not None and bias.dtype == torch.float32 and bias.numel() == 1)

    @staticmethod
    def decode_attention_kernel(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
        """Whether the paged attention kernels serve a cache: a power-of-two head size of at least 16 (tl.dot's
        least), bf16, fp16 or fp32."""
        return (KernelPolicy.runs_kernels(device) and head_dim >= 16 and head_dim & (head_dim - 1) == 0
                and dtype in _KERNEL_DTYPES)

    @staticmethod
    def sampling_kernel(scores: torch.Tensor) -> bool:
        """Whether one program a row draws from fp32 scores [B, V] (the noise made inside it)."""
        return (HAS_TRITON and scores.is_cuda and scores.dtype == torch.float32 and scores.dim() == 2
                and scores.shape[1] <= MAX_SAMPLING_VOCAB and scores.stride(-1) == 1)

    @staticmethod
    def codebook0_kernel(logits: torch.Tensor) -> bool:
        """Whether one program a row processes codebook 0's logits [B, V] and draws from them."""
        return (HAS_TRITON and logits.is_cuda and logits.dim() == 2 and logits.shape[1] <= MAX_SAMPLING_VOCAB
                and logits.stride(-1) == 1)

    @staticmethod
    def predictor_pass_rows(num_rows: int) -> bool:
        """Whether the predictor pass (where it was built) beats the layer chain at `num_rows` rows."""
        return 1 <= num_rows <= MAX_PREDICTOR_PASS_ROWS


def token_stride(x: torch.Tensor) -> int | None:
    """The step between consecutive tokens of x [B, T, H, D] read as B*T tokens; None where it is not even.
    A dimension of size 1 may carry any stride, so a single-token row steps by the batch stride."""
    if x.shape[1] == 1:
        return x.stride(0)
    if x.shape[0] == 1 or x.stride(0) == x.shape[1] * x.stride(1):
        return x.stride(1)
    return None


def _is_kernel_tensor(x: torch.Tensor) -> bool:
    return HAS_TRITON and x.is_cuda and x.dtype in _KERNEL_DTYPES and x.stride(-1) == 1


def _is_snake_kernel_tensor(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor) -> bool:
    # Parameters in fp32 upcast x of any dtype in the eager chain, as the kernel does; otherwise the dtypes match.
    return (_is_kernel_tensor(x) and x.dim() == 3 and x.is_contiguous() and log_alpha.dtype == log_beta.dtype
            and log_alpha.dtype in (x.dtype, torch.float32))
