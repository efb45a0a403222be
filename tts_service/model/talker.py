"""The talker (predicts codebook 0 of each frame) and the code predictor (codebooks 1..15).

Module names mirror the published checkpoint (`talker.model.layers.N...`,
`talker.code_predictor.lm_head.N...`) so weights load by name with no translation table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tts_service.model import fused_ops
from tts_service.model.configs import TalkerConfig
from tts_service.model.layers import (
    AttentionBackend,
    DecoderStack,
    interleaved_mrope_cos_sin,
    pack_weights,
    rope_cos_sin,
    rope_inverse_frequencies,
)


class TalkerBackbone(DecoderStack):
    def __init__(self, config: TalkerConfig) -> None:
        super().__init__(config.layers)
        self.codec_embedding = nn.Embedding(config.layers.vocab_size, config.layers.hidden_size)
        self.text_embedding = nn.Embedding(config.text_vocab_size, config.text_hidden_size)


class TextProjection(nn.Module):
    """Maps text-model embeddings into the talker's width (a two-layer MLP with biases)."""

    def __init__(self, text_hidden_size: int, hidden_size: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden_size, text_hidden_size, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden_size, hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class CodePredictorBackbone(DecoderStack):
    def __init__(self, config: TalkerConfig) -> None:
        super().__init__(config.code_predictor)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(config.code_predictor.vocab_size, config.layers.hidden_size)
            for _ in range(config.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    """Predicts codebooks 1..G-1 of a frame from the talker's hidden state and codebook 0.

    Each frame is a fresh sequence: [talker hidden, embed(code 0), embed(code 1), ...] at
    positions 0, 1, 2, ...; head g-1 predicts codebook g.
    """

    def __init__(self, config: TalkerConfig) -> None:
        super().__init__()
        shape = config.code_predictor
        self.model = CodePredictorBackbone(config)
        self.lm_head = nn.ModuleList(
            nn.Linear(shape.hidden_size, shape.vocab_size, bias=False) for _ in range(config.num_code_groups - 1)
        )
        self.small_to_mtp_projection: nn.Module = (
            nn.Linear(config.layers.hidden_size, shape.hidden_size, bias=True)
            if config.has_mtp_projection else nn.Identity()
        )
        self.register_buffer("inv_freq", rope_inverse_frequencies(shape.head_dim, shape.rope_theta),
                             persistent=False)

    def embed(self, codebook: int, codes: torch.Tensor) -> torch.Tensor:
        """Embedding (in talker width) of codes of codebook 1..G-1."""
        return self.model.codec_embedding[codebook - 1](codes)

    def embedding_table(self, codebook: int) -> torch.Tensor:
        """The table [V, talker width] that `embed` looks codebook's codes up in."""
        return self.model.codec_embedding[codebook - 1].weight

    def rope_table(self, num_positions: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [1, num_positions, head_dim] of positions 0, 1, ...: every frame's sequence starts at 0, so
        one table serves all its calls."""
        positions = torch.arange(num_positions, device=self.inv_freq.device)[None]
        return rope_cos_sin(self.inv_freq, positions, dtype)

    def hidden(self, inputs_embeds: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               backend: AttentionBackend) -> torch.Tensor:
        """inputs [B, T, talker width] at positions whose cos and sin ([B, T, head_dim], from `rope_table`) are
        given -> hidden states [B, T, H]."""
        x = self.small_to_mtp_projection(inputs_embeds)
        return self.model.run_layers(x, cos, sin, backend)

    def logits(self, codebook: int, hidden: torch.Tensor) -> torch.Tensor:
        """Logits for codebook 1..G-1."""
        return self.lm_head[codebook - 1](hidden)


class Talker(nn.Module):
    def __init__(self, config: TalkerConfig) -> None:
        super().__init__()
        self.config = config
        self.model = TalkerBackbone(config)
        self.text_projection = TextProjection(config.text_hidden_size, config.layers.hidden_size)
        self.codec_head = nn.Linear(config.layers.hidden_size, config.layers.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config)
        self.register_buffer("inv_freq", rope_inverse_frequencies(config.layers.head_dim,
                                                                  config.layers.rope_theta), persistent=False)
        # Packed on CUDA by `use_fused_kernels`: every codebook's table as rows of one, and where each starts.
        self.frame_table: torch.Tensor | None
        self.frame_offsets: torch.Tensor | None
        self.register_buffer("frame_table", None, persistent=False)
        self.register_buffer("frame_offsets", None, persistent=False)

    def pack_projections(self) -> None:
        """Hold the frame's 16 embedding tables (lookups: one-hot projections) as rows of one table, each module's
        weight a view of its rows, so that `embed_frame` gathers a frame in one lookup instead of sixteen and a
        concatenation. The sum that follows is the same reduction over the same [..., G, hidden] values."""
        if self.frame_table is not None:
            return
        tables = [self.model.codec_embedding, *self.code_predictor.model.codec_embedding]
        sizes = torch.tensor([0] + [table.weight.shape[0] for table in tables[:-1]])
        self.frame_table = pack_weights(*tables)
        self.frame_offsets = sizes.cumsum(0).to(self.frame_table.device)

    def embed_text(self, text_ids: torch.Tensor) -> torch.Tensor:
        return self.text_projection(self.model.text_embedding(text_ids))

    def embed_codec(self, codec_ids: torch.Tensor) -> torch.Tensor:
        return self.model.codec_embedding(codec_ids)

    def codec_embedding_table(self) -> torch.Tensor:
        """The table [V, hidden] that `embed_codec` looks codebook 0's ids up in."""
        return self.model.codec_embedding.weight

    def embed_frame(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [..., G] -> the sum of every codebook's embedding [..., hidden]."""
        if self.frame_table is not None:
            return F.embedding(codes + self.frame_offsets, self.frame_table).sum(-2)
        parts = [self.embed_codec(codes[..., 0])]
        parts += [self.code_predictor.embed(g, codes[..., g]) for g in range(1, self.config.num_code_groups)]
        return torch.stack(parts, dim=-2).sum(-2)

    def next_inputs(self, frames: torch.Tensor, slots: torch.Tensor, text_ids: torch.Tensor) -> torch.Tensor:
        """The decode step's inputs [B, hidden] for rows whose previous frames are frames[slots] ([S, G]): every
        codebook's embedding summed, plus the text's. With the packed table, one kernel on CUDA (`fused_ops.
        frame_embedding`: the same values)."""
        text = self.embed_text(text_ids)
        if self.frame_table is not None:
            return fused_ops.frame_embedding(frames, slots, self.frame_table, self.frame_offsets, text)
        return self.embed_frame(frames[slots]) + text

    def hidden(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, backend: AttentionBackend,
               rope_rows: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """inputs_embeds [B, T, H], positions [B, T] -> final-norm hidden states [B, T, H]. With `rope_rows`
        (cos, sin [P, head_dim] from `rope_rows`), each position's rows are gathered rather than computed: the
        positions must then be below P."""
        if rope_rows is not None:
            cos_rows, sin_rows = rope_rows
            cos, sin = cos_rows[positions], sin_rows[positions]
        else:
            cos, sin = self.rope_cos_sin(positions, inputs_embeds.dtype)
        return self.model.run_layers(inputs_embeds, cos, sin, backend)

    def rope_cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, T, head_dim] of positions [B, T], the same position in every mRoPE stream (as speech
        takes it)."""
        if self.config.mrope_interleaved:
            streams = positions.unsqueeze(0).expand(len(self.config.mrope_section), -1, -1)
            return interleaved_mrope_cos_sin(self.inv_freq, streams, self.config.mrope_section, dtype)
        return rope_cos_sin(self.inv_freq, positions, dtype)

    def rope_rows(self, num_positions: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [num_positions, head_dim] of positions 0..num_positions-1, for `hidden` to gather from (two
        kernels where computing them is some ten small kernels a step). The rows are the values `rope_cos_sin`
        gives on CUDA, whose elementwise kernels compute each element alike wherever it lies."""
        positions = torch.arange(num_positions, device=self.inv_freq.device)[None]
        cos, sin = self.rope_cos_sin(positions, dtype)
        return cos[0], sin[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.codec_head(hidden)
