"""How the runner lays out the device: slots, KV blocks, and which shapes are captured as CUDA graphs.

Built by `EngineConfig.runner_config()`, which holds every default; this record only checks that the
derived sizes make sense together.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunnerConfig:
    max_num_slots: int  # per-request state rows; also the largest decode batch
    block_size: int  # KV positions per block (a power of two)
    max_positions_per_request: int  # the block table's width, in positions
    num_kv_blocks: int | None  # None: size from free device memory
    kv_memory_fraction: float  # of the free device memory, when sizing the KV cache from it
    graph_batch_sizes: tuple[int, ...]
    use_cuda_graphs: bool
    # The decoder layers' elementwise chains as single Triton kernels (CUDA only; see fused_ops).
    use_fused_kernels: bool
    # With the fused kernels: a code predictor call at one or two rows as one persistent kernel (predictor_pass).
    use_predictor_kernel: bool
    # Chunk lengths (frames) whose codec decode is captured, for every batch bucket; other
    # lengths (a stream's last chunk, a restart's context) run eagerly.
    codec_graph_chunk_sizes: tuple[int, ...]
    # Prefills of up to the largest of these many requests, padded to the next of these prompt
    # lengths, replay a captured talker prefill; larger ones run eagerly.
    prefill_graph_batch_sizes: tuple[int, ...]
    prefill_graph_lengths: tuple[int, ...]
    profile_steps: bool  # device time per phase of every step (PhaseTimer); costs a few events per step
    # Clone voices whose codec state after their reference frames is kept (primed_voices); 0: none.
    max_primed_voices: int

    def __post_init__(self) -> None:
        if self.max_num_slots < 1:
            raise ValueError("max_num_slots must be >= 1")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a power of two")
        if self.max_positions_per_request < 1:
            raise ValueError("max_positions_per_request must be >= 1")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be >= 1")
        if not 0.0 < self.kv_memory_fraction < 1.0:
            raise ValueError("kv_memory_fraction must be in (0, 1)")
        if sorted(set(self.graph_batch_sizes)) != list(self.graph_batch_sizes) or self.graph_batch_sizes[0] < 1:
            raise ValueError("graph_batch_sizes must be increasing positive integers")
        if self.max_primed_voices < 0:
            raise ValueError("max_primed_voices must be >= 0")
        if any(size < 1 for size in self.codec_graph_chunk_sizes):
            raise ValueError("codec_graph_chunk_sizes must be positive")
        for name in ("prefill_graph_batch_sizes", "prefill_graph_lengths"):
            sizes = getattr(self, name)
            if sorted(set(sizes)) != list(sizes) or (sizes and sizes[0] < 1):
                raise ValueError(f"{name} must be increasing positive integers")

    @property
    def max_blocks_per_request(self) -> int:
        return -(-self.max_positions_per_request // self.block_size)

    def prefill_buckets(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Captured prefill batch sizes (up to the slot count) and prompt lengths (up to a request's)."""
        return (tuple(size for size in self.prefill_graph_batch_sizes if size <= self.max_num_slots),
                tuple(length for length in self.prefill_graph_lengths if length <= self.max_positions_per_request))

    def batch_buckets(self) -> tuple[int, ...]:
        """Captured sizes up to the slot count, always ending at the slot count itself."""
        sizes = [size for size in self.graph_batch_sizes if size < self.max_num_slots]
        return (*sizes, self.max_num_slots)
