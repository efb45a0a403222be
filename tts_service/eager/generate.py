"""The eager generate path: prompts -> codes, one frame at a time, for a batch of requests.

This is the correctness baseline the batched engine is held against, so it stays small and
plain: a growing key/value cache per layer, left-padded prompts, no graphs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tts_service.model.embedding import embed_prompt, embed_text_ids
from tts_service.model.layers import repeat_kv
from tts_service.model.prompts import Prompt
from tts_service.model.talker import Talker
from tts_service.runner.frame_codes import predict_remaining_codebooks, process_codebook0_logits, suppressed_ids_mask
from tts_service.runner.params import GenerationParams
from tts_service.runner.sampling import RowSampling, sample


@dataclass(frozen=True)
class GeneratedCodes:
    codes: torch.Tensor  # [frames, codebooks] int64, on the CPU
    finish_reason: str  # "stop" (EOS) or "length" (max_new_frames)


@dataclass(frozen=True)
class GenerationRequest:
    prompt: Prompt
    params: GenerationParams = field(default_factory=GenerationParams)
    speaker_embedding: torch.Tensor | None = None


class EagerKVCache:
    """Concatenating K/V cache with a key-validity mask for left-padded rows."""

    def __init__(self, key_valid: torch.Tensor) -> None:
        self.key_valid = key_valid  # [B, S] bool
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def prepare(self, start: int, num_tokens: int) -> None:
        """Called before each forward: `num_tokens` new tokens follow the ones already held."""
        self.append_valid(num_tokens)

    def append_valid(self, num_tokens: int) -> None:
        extra = torch.ones(self.key_valid.shape[0], num_tokens, dtype=torch.bool, device=self.key_valid.device)
        self.key_valid = torch.cat([self.key_valid, extra], dim=1)

    def __call__(self, layer_index: int, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> torch.Tensor:
        if layer_index in self.keys:
            key = torch.cat([self.keys[layer_index], key], dim=2)
            value = torch.cat([self.values[layer_index], value], dim=2)
        self.keys[layer_index], self.values[layer_index] = key, value
        num_queries, num_keys = query.shape[2], key.shape[2]
        query_index = torch.arange(num_keys - num_queries, num_keys, device=query.device)[:, None]
        key_index = torch.arange(num_keys, device=query.device)[None, :]
        # A padding query attends to itself only, so its (unused) output stays finite.
        allowed = ((key_index <= query_index) & self.key_valid[:, None, :]) | (key_index == query_index)
        num_heads = query.shape[1]
        return F.scaled_dot_product_attention(query, repeat_kv(key, num_heads), repeat_kv(value, num_heads),
                                              attn_mask=allowed[:, None])


@torch.inference_mode()
def generate_codes(talker: Talker, requests: list[GenerationRequest], tts_pad_id: int) -> list[GeneratedCodes]:
    """Generate every request's frames until EOS or its frame limit."""
    device = talker.codec_head.weight.device
    config = talker.config
    batch = len(requests)
    num_groups = config.num_code_groups

    prompts = [embed_prompt(talker, r.prompt, r.speaker_embedding) for r in requests]
    lengths = torch.tensor([p.shape[0] for p in prompts], device=device)
    max_len = int(lengths.max())
    inputs = torch.stack([F.pad(p, (0, 0, max_len - p.shape[0], 0)) for p in prompts])
    padding = (max_len - lengths)[:, None]
    slots = torch.arange(max_len, device=device)[None, :]
    cache = EagerKVCache(slots >= padding)
    positions = (slots - padding).clamp(min=0)

    trailing = [embed_text_ids(talker, r.prompt.trailing_text_ids) if r.prompt.trailing_text_ids else None
                for r in requests]
    pad_embedding = embed_text_ids(talker, [tts_pad_id])[0]

    params = [r.params for r in requests]
    talker_rows = RowSampling.from_params([p.talker for p in params], device)
    predictor_rows = RowSampling.from_params([p.predictor for p in params], device)
    penalty = torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32, device=device)
    seeds = torch.tensor([p.seed for p in params], dtype=torch.int64, device=device)
    min_frames = torch.tensor([p.min_new_frames for p in params], device=device)
    max_frames = [p.max_new_frames for p in params]
    suppressed = suppressed_ids_mask(talker)
    seen = torch.zeros(batch, config.layers.vocab_size, dtype=torch.bool, device=device)

    hidden = talker.hidden(inputs, positions, cache)[:, -1]
    frames: list[list[torch.Tensor]] = [[] for _ in range(batch)]
    reasons: list[str | None] = [None] * batch
    for step in range(max(max_frames)):
        draws = torch.full((batch,), step * num_groups, dtype=torch.int64, device=device)
        scores = process_codebook0_logits(talker.logits(hidden), seen, penalty, suppressed,
                                          step < min_frames, config.codec_eos_id)
        code0 = sample(scores, talker_rows, seeds, draws)
        seen[torch.arange(batch, device=device), code0] = True
        is_eos = (code0 == config.codec_eos_id).tolist()
        for row in range(batch):
            if reasons[row] is None and is_eos[row]:
                reasons[row] = "stop"
        if all(reason is not None for reason in reasons):
            break
        memory = EagerKVCache(torch.ones(batch, 0, dtype=torch.bool, device=device))
        rest = predict_remaining_codebooks(talker, hidden, code0, predictor_rows, seeds, draws, memory)
        frame = torch.cat([code0[:, None], rest], dim=1)
        for row in range(batch):
            if reasons[row] is None:
                frames[row].append(frame[row])
                if len(frames[row]) == max_frames[row]:
                    reasons[row] = "length"
        if all(reason is not None for reason in reasons):
            break
        text = torch.stack([t[step] if t is not None and step < t.shape[0] else pad_embedding for t in trailing])
        cache.append_valid(1)
        positions = (lengths + step)[:, None]
        hidden = talker.hidden((talker.embed_frame(frame) + text)[:, None], positions, cache)[:, -1]

    return [GeneratedCodes(torch.stack(rows).cpu() if rows else torch.zeros(0, num_groups, dtype=torch.long),
                           reason or "length")
            for rows, reason in zip(frames, reasons, strict=True)]
