"""The per-frame compute of the batched engine, written so a CUDA graph can capture it.

Everything a step reads lives in tensors whose addresses never change: per-slot request state
(seeds, sampling settings, repetition history, the last frame) and the code predictor's static
cache. Rows are addressed by slot; padding rows point at a scratch slot that no request owns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tts_service.model.kernel_policy import KernelPolicy
from tts_service.model.layers import repeat_kv
from tts_service.model.talker import Talker
from tts_service.runner.frame_codes import (
    CodebookLogits,
    PredictorMemory,
    predict_remaining_codebooks,
    process_codebook0_logits,
    suppressed_ids_mask,
)
from tts_service.runner.kv_cache import PagedKVCache, decode_attention_triton, store_kv_triton
from tts_service.runner.params import GenerationParams
from tts_service.runner.predictor_pass import PredictorPass
from tts_service.runner.sampling import RowSampling
from tts_service.runner.sampling_kernel import KernelSampler, SlotTensors, sample_codebook0


def queued_upload(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`values` on `device`, copied in stream order. `torch.tensor(values, device=...)` would first wait for all the
    work queued on the current stream (its copy is a blocking one), and so hold the host while the device runs."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


class PredictorCache:
    """Static keys/values for the code predictor's sequence of at most G positions per frame."""

    def __init__(self, talker: Talker, max_batch_size: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = talker.config.code_predictor
        size = (shape.num_hidden_layers, max_batch_size, shape.num_key_value_heads,
                talker.config.num_code_groups, shape.head_dim)
        self.keys = torch.zeros(size, dtype=dtype, device=device)
        self.values = torch.zeros(size, dtype=dtype, device=device)
        self.start = 0
        self.end = 0

    def prepare(self, start: int, num_tokens: int) -> None:
        self.start, self.end = start, start + num_tokens

    def __call__(self, layer_index: int, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> torch.Tensor:
        batch, num_heads, num_tokens, _ = query.shape
        end = self.end
        keys = self.keys[layer_index, :batch]
        values = self.values[layer_index, :batch]
        keys[:, :, self.start:end].copy_(key)
        values[:, :, self.start:end].copy_(value)
        # Only the frame's first call holds several tokens, and it starts at 0: a square causal mask.
        return F.scaled_dot_product_attention(
            query, repeat_kv(keys[:, :, :end], num_heads), repeat_kv(values[:, :, :end], num_heads),
            is_causal=num_tokens > 1)


class PagedPredictorCache:
    """The code predictor's keys/values in the paged layout that the talker's Triton kernels read: one block of
    G positions per row (block b holds row b). A codebook's attention is then one attention kernel per layer,
    which also stores the new key and value, where `PredictorCache` runs two cache copies, two GQA expansions and
    SDPA."""

    def __init__(self, talker: Talker, max_batch_size: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = talker.config.code_predictor
        num_positions = talker.config.num_code_groups
        self.cache = PagedKVCache(shape.num_hidden_layers, max_batch_size, num_positions,
                                  shape.num_key_value_heads, shape.head_dim, dtype, device)
        self.block_tables = torch.arange(max_batch_size, dtype=torch.int32, device=device)[:, None]
        # Row p holds position p for every row: a static tensor per position, so nothing is written per call.
        self.positions = torch.arange(num_positions, device=device)[:, None].repeat(1, max_batch_size)
        self.start = 0
        self.num_tokens = 0

    def prepare(self, start: int, num_tokens: int) -> None:
        self.start, self.num_tokens = start, num_tokens

    def __call__(self, layer_index: int, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> torch.Tensor:
        batch, num_heads = query.shape[:2]
        layer = self.cache.layer(layer_index)
        tables = self.block_tables[:batch]
        scratch = self.cache.scratch_block
        if self.num_tokens == 1:
            positions = self.positions[self.start, :batch]
            return decode_attention_triton(layer, query[:, :, 0], key[:, :, 0], value[:, :, 0], tables, positions,
                                           scratch, num_splits=1)[:, :, None]
        for token in range(self.num_tokens):
            store_kv_triton(layer, key[:, :, token], value[:, :, token], tables,
                            self.positions[self.start + token, :batch], scratch)
        # Only the frame's first call holds several tokens, and they are the whole sequence: a square causal mask.
        return F.scaled_dot_product_attention(query, repeat_kv(key, num_heads), repeat_kv(value, num_heads),
                                              is_causal=True)


def predictor_memory(talker: Talker, max_batch_size: int, kernels: KernelPolicy) -> PredictorMemory:
    """The paged memory where the fused path is on and the attention kernels serve its shapes, else the copying
    one (the CPU path)."""
    head_dim = talker.config.code_predictor.head_dim
    if kernels.fused and KernelPolicy.decode_attention_kernel(kernels.device, kernels.dtype, head_dim):
        return PagedPredictorCache(talker, max_batch_size, kernels.dtype, kernels.device)
    return PredictorCache(talker, max_batch_size, kernels.dtype, kernels.device)


def predictor_call(talker: Talker, memory: PredictorMemory, kernels: KernelPolicy) -> CodebookLogits | None:
    """The one-kernel predictor call for small batches, where the policy runs it, the memory is paged and the
    kernel covers the predictor's shapes; None elsewhere (the layer-by-layer chain then runs at every batch)."""
    if not (kernels.predictor_pass and isinstance(memory, PagedPredictorCache) and PredictorPass.covers(talker)):
        return None
    return PredictorPass(talker, memory.cache.storage)


@dataclass
class SlotState:
    """Per-request decoding state on the device, one row per slot plus a scratch row."""

    seeds: torch.Tensor  # [S + 1] int64
    talker_temperature: torch.Tensor
    talker_top_k: torch.Tensor
    talker_top_p: torch.Tensor
    predictor_temperature: torch.Tensor
    predictor_top_k: torch.Tensor
    predictor_top_p: torch.Tensor
    repetition_penalty: torch.Tensor
    min_frames: torch.Tensor
    seen: torch.Tensor  # [S + 1, vocab] bool: codebook-0 ids generated so far
    last_frame: torch.Tensor  # [S + 1, G] int64

    @classmethod
    def allocate(cls, num_slots: int, vocab_size: int, num_groups: int, device: torch.device) -> SlotState:
        rows = num_slots + 1

        def floats(value: float) -> torch.Tensor:
            return torch.full((rows,), value, dtype=torch.float32, device=device)

        def ints(value: int) -> torch.Tensor:
            return torch.full((rows,), value, dtype=torch.int64, device=device)

        return cls(seeds=ints(0), talker_temperature=floats(0.0), talker_top_k=ints(0), talker_top_p=floats(1.0),
                   predictor_temperature=floats(0.0), predictor_top_k=ints(0), predictor_top_p=floats(1.0),
                   repetition_penalty=floats(1.0), min_frames=ints(0),
                   seen=torch.zeros(rows, vocab_size, dtype=torch.bool, device=device),
                   last_frame=torch.zeros(rows, num_groups, dtype=torch.int64, device=device))

    @property
    def scratch_slot(self) -> int:
        return self.seeds.shape[0] - 1

    def assign(self, slots: list[int], params: list[GenerationParams]) -> None:
        """Set slots for new requests (outside any captured region). Writing a Python number into a device tensor
        waits for the device, so the values go up in two copies queued in stream order."""
        device = self.seeds.device
        rows = queued_upload(slots, torch.int64, device)
        floats = queued_upload([[p.talker.temperature, p.talker.top_p, p.predictor.temperature, p.predictor.top_p,
                                 p.repetition_penalty] for p in params], torch.float32, device)
        ints = queued_upload([[p.seed, p.talker.top_k, p.predictor.top_k, p.min_new_frames] for p in params],
                             torch.int64, device)
        for column, tensor in enumerate((self.talker_temperature, self.talker_top_p, self.predictor_temperature,
                                         self.predictor_top_p, self.repetition_penalty)):
            tensor.index_copy_(0, rows, floats[:, column])
        for column, tensor in enumerate((self.seeds, self.talker_top_k, self.predictor_top_k, self.min_frames)):
            tensor.index_copy_(0, rows, ints[:, column])
        self.seen.index_fill_(0, rows, False)

    def slot_tensors(self) -> SlotTensors:
        """What the codebook-0 kernel reads through each row's slot (the same tensors, not copies)."""
        return SlotTensors(self.talker_temperature, self.talker_top_k, self.talker_top_p, self.predictor_temperature,
                           self.predictor_top_k, self.predictor_top_p, self.seeds, self.repetition_penalty,
                           self.min_frames, self.seen)

    def talker_rows(self, slots: torch.Tensor) -> RowSampling:
        return RowSampling(self.talker_temperature[slots], self.talker_top_k[slots], self.talker_top_p[slots])

    def predictor_rows(self, slots: torch.Tensor) -> RowSampling:
        return RowSampling(self.predictor_temperature[slots], self.predictor_top_k[slots],
                           self.predictor_top_p[slots])


class FrameSampler:
    """Talker hidden state -> a whole frame: codebook 0 from the talker head, the rest from the predictor; each draw
    by a sampling kernel where `KernelPolicy` says one runs."""

    def __init__(self, talker: Talker, state: SlotState, predictor_cache: PredictorMemory,
                 predictor_call: CodebookLogits | None = None) -> None:
        self.talker = talker
        self.state = state
        self.predictor_cache = predictor_cache
        self.predictor_call = predictor_call
        self.sampling = KernelSampler()
        self.suppressed = suppressed_ids_mask(talker)
        self.num_groups = talker.config.num_code_groups
        self.slot_tensors = state.slot_tensors()

    def __call__(self, hidden: torch.Tensor, slots: torch.Tensor, frame_index: torch.Tensor) -> torch.Tensor:
        state = self.state
        talker = self.talker
        logits = talker.logits(hidden)
        if KernelPolicy.codebook0_kernel(logits):
            drawn = sample_codebook0(logits, slots, frame_index, self.slot_tensors, self.suppressed,
                                     talker.config.codec_eos_id, self.num_groups, talker.codec_embedding_table())
            code0 = drawn.codes
            rest = predict_remaining_codebooks(
                talker, hidden, code0,
                RowSampling(drawn.predictor_temperature, drawn.predictor_top_k, drawn.predictor_top_p), drawn.seeds,
                drawn.draws, self.predictor_cache, self.predictor_call, drawn.embedding, sampler=self.sampling)
        else:
            scores = process_codebook0_logits(logits, state.seen[slots], state.repetition_penalty[slots],
                                              self.suppressed, frame_index < state.min_frames[slots],
                                              talker.config.codec_eos_id)
            seeds = state.seeds[slots]
            draws = frame_index * self.num_groups
            code0 = self.sampling.sample(scores, state.talker_rows(slots), seeds, draws)
            # A device-side value: a Python scalar here would be a host copy, which graph capture forbids.
            state.seen.index_put_((slots, code0), torch.ones_like(code0, dtype=torch.bool))
            rest = predict_remaining_codebooks(talker, hidden, code0, state.predictor_rows(slots), seeds, draws,
                                               self.predictor_cache, self.predictor_call, sampler=self.sampling)
        frame = torch.cat([code0[:, None], rest], dim=1)
        state.last_frame[slots] = frame
        return frame
