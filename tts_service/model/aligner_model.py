"""The Qwen3-ForcedAligner network in plain torch, and loading it from a checkpoint in the published layout.

One forward pass, no decoding: an audio encoder turns each clip's log-mel frames into tokens of the text model's
width; those replace the `<|audio_pad|>` placeholders of the prompt; a Qwen3 decoder (the same layers as the TTS
talker's, `layers.DecoderStack`) reads the prompt causally, and a linear head classifies every position into one of
`classify_num` timestamp classes. Only the classes at the `<timestamp>` tokens are read.

Module names mirror the checkpoint (`thinker.audio_tower.*`, `thinker.model.*`, `thinker.lm_head.*`), so weights
load by name. The math follows the reference (qwen-asr 0.0.6 under transformers' default SDPA attention) step by
step, including where it rounds, so that float32 logits agree to float32 noise and the predicted classes are equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from packaging.version import Version
from torch import nn

from tts_service.model.aligner_config import (
    ALIGNER_CONFIG_FILE,
    CHUNK_FRAMES,
    PREPROCESSOR_CONFIG_FILE,
    AlignerConfig,
    check_preprocessor,
    conv_output_length,
)
from tts_service.model.checkpoint import CheckpointError, cast_weights_, load_strict, read_json, read_tensors
from tts_service.model.configs import ConfigError
from tts_service.model.layers import DecoderStack, repeat_kv, rope_cos_sin, rope_inverse_frequencies
from tts_service.model.text_tokenizer import TextTokenizerError, load_text_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, WhisperFeatureExtractor

WEIGHTS_FILE = "model.safetensors"
# Files of the published layout the aligner reads (the tokenizer's own are checked by `load_text_tokenizer`).
REQUIRED_FILES = (ALIGNER_CONFIG_FILE, PREPROCESSOR_CONFIG_FILE)
# transformers' SDPA path hands grouped-query attention to torch from 2.5 on, and repeats the keys before that.
_SDPA_HAS_GQA = Version(torch.__version__.split("+")[0]) >= Version("2.5")


def sinusoid_positions(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """Whisper's fixed position table [length, channels]: sines, then cosines, in float32."""
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inverse_timescales = torch.exp(-increment * torch.arange(channels // 2, dtype=torch.float32))
    scaled_time = torch.arange(length)[:, None] * inverse_timescales[None, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


class AudioAttention(nn.Module):
    """Bidirectional attention over a whole clip's tokens, with biases."""

    def __init__(self, width: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = (width // num_heads) ** -0.5
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, clip_sizes: list[int] | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [S, width] -> [S, width]: the tokens of one clip, or of several one after another (`clip_sizes`),
        each clip attending to itself only. The projections take every clip at once; the attention runs clip by
        clip, as one clip alone runs it, so that a batch gives each clip the numbers it gets alone. Packed clips
        (`bias` [1, 1, S, S], `segment_bias`: which keys each token sees) attend in one call instead, as a captured
        graph needs."""
        length = x.shape[0]

        def heads(projection: nn.Linear) -> torch.Tensor:
            return projection(x).reshape(length, self.num_heads, -1).transpose(0, 1)[None]

        # The reference builds a block mask for 8-second windows but, outside flash-attention, never passes it:
        # every token sees the whole clip. Its SDPA call asks for grouped-query attention even with equal heads.
        extra = {"enable_gqa": True} if _SDPA_HAS_GQA else {}
        if bias is not None:
            out = F.scaled_dot_product_attention(heads(self.q_proj), heads(self.k_proj), heads(self.v_proj),
                                                 attn_mask=bias, scale=self.scale)
            return self.out_proj(out[0].transpose(0, 1).reshape(length, -1))
        sizes = clip_sizes or [length]
        per_clip = zip(*(projection.split(sizes, dim=2) for projection in
                         (heads(self.q_proj), heads(self.k_proj), heads(self.v_proj))), strict=True)
        out = torch.cat([F.scaled_dot_product_attention(query, key, value, scale=self.scale, is_causal=False,
                                                        **extra) for query, key, value in per_clip], dim=2)
        return self.out_proj(out.transpose(1, 2).reshape(length, -1))


class AudioEncoderLayer(nn.Module):
    def __init__(self, width: int, num_heads: int, ffn_width: int) -> None:
        super().__init__()
        self.self_attn = AudioAttention(width, num_heads)
        self.self_attn_layer_norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, ffn_width)
        self.fc2 = nn.Linear(ffn_width, width)
        self.final_layer_norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor, clip_sizes: list[int] | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), clip_sizes, bias)
        x = x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))
        if x.dtype == torch.float16:  # as the reference: keep fp16 activations finite
            limit = torch.finfo(x.dtype).max - 1000
            x = x.clamp(min=-limit, max=limit)
        return x


def _chunk_lengths(frames: int) -> list[int]:
    """A clip's frames cut into the encoder's chunks: whole ones, then what is left."""
    return [CHUNK_FRAMES] * (frames // CHUNK_FRAMES) + ([frames % CHUNK_FRAMES] if frames % CHUNK_FRAMES else [])


class AudioEncoder(nn.Module):
    """Log-mel frames of one clip -> its audio tokens, one per 8 frames of each 100-frame chunk (rounded up)."""

    def __init__(self, config: AlignerConfig) -> None:
        super().__init__()
        audio = config.audio
        self.conv_chunksize = audio.conv_chunksize
        channels = audio.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, channels, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(channels, channels, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(channels, channels, 3, 2, padding=1)
        self.conv_out = nn.Linear(audio.conv_out_features, audio.d_model, bias=False)
        self.layers = nn.ModuleList(AudioEncoderLayer(audio.d_model, audio.encoder_attention_heads,
                                                      audio.encoder_ffn_dim) for _ in range(audio.encoder_layers))
        self.ln_post = nn.LayerNorm(audio.d_model)
        self.proj1 = nn.Linear(audio.d_model, audio.d_model)
        self.proj2 = nn.Linear(audio.d_model, audio.output_dim)
        # Not in the checkpoint; kept in float32 and cast where it is added, as the reference does.
        self.positions: torch.Tensor
        self.register_buffer("positions", sinusoid_positions(audio.max_source_positions, audio.d_model),
                             persistent=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [mel bins, frames] -> tokens [audio_token_count(frames), output_dim]."""
        return self.encode_many([features])[0]

    def encode_many(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """Several clips' log-mel frames in one pass: every clip's chunks convolved together, and the clips'
        tokens through the layers together, each attending to its own clip only (see AudioAttention)."""
        lengths = [_chunk_lengths(item.shape[1]) for item in features]
        # Every chunk is convolved on its own, a short last one padded with zeros to the longest: position and
        # padding restart at each chunk, as the model was trained.
        pieces = [piece for item, item_lengths in zip(features, lengths, strict=True)
                  for piece in item.T.split(item_lengths)]
        chunks = nn.utils.rnn.pad_sequence(pieces, batch_first=True)
        convolved = torch.cat([self._convolve(part) for part in chunks.transpose(1, 2)[:, None]
                               .split(self.conv_chunksize)])
        num_chunks, channels, bins, steps = convolved.shape
        tokens = self.conv_out(convolved.permute(0, 3, 1, 2).reshape(num_chunks, steps, channels * bins))
        tokens = tokens + self.positions[:steps].to(tokens.dtype)
        flat_lengths = [length for item_lengths in lengths for length in item_lengths]
        x = torch.cat([chunk[:conv_output_length(length)] for chunk, length in zip(tokens, flat_lengths,
                                                                                    strict=True)])
        clip_sizes = [sum(conv_output_length(length) for length in item_lengths) for item_lengths in lengths]
        for layer in self.layers:
            x = layer(x, clip_sizes)
        return list(self.proj2(F.gelu(self.proj1(self.ln_post(x)))).split(clip_sizes))

    def encode_packed(self, chunks: torch.Tensor, chunk_width: torch.Tensor, token_clip: torch.Tensor) -> torch.Tensor:
        """Whole chunks of every clip [C, mel bins, CHUNK_FRAMES] (a short last chunk zero-padded) -> every chunk
        position's token [C * tokens a chunk, output_dim], in shapes that depend on C alone. `chunk_width` [C]: the
        frames each chunk is padded to when its clip is encoded alone (the clip's longest chunk); the convolutions
        see zeros past it, as they would. `token_clip` [C * tokens a chunk] names each position's clip, -1 where no
        frame is behind it (a short chunk's tail, padding): those positions are no one's keys, and their own outputs
        are not read."""
        x = chunks[:, None]
        for index, convolution in enumerate((self.conv2d1, self.conv2d2, self.conv2d3)):
            x = F.gelu(convolution(x))
            chunk_width = (chunk_width - 1).div(2, rounding_mode="floor") + 1
            if index < 2:  # the next convolution pads this one's output with zeros where it ends
                x = x * (torch.arange(x.shape[-1], device=x.device) < chunk_width[:, None])[:, None, None].to(x.dtype)
        convolved = x
        num_chunks, channels, bins, steps = convolved.shape
        tokens = self.conv_out(convolved.permute(0, 3, 1, 2).reshape(num_chunks, steps, channels * bins))
        x = (tokens + self.positions[:steps].to(tokens.dtype)).reshape(num_chunks * steps, -1)
        bias = segment_bias(token_clip, is_causal=False, dtype=x.dtype)
        for layer in self.layers:
            x = layer(x, bias=bias)
        return self.proj2(F.gelu(self.proj1(self.ln_post(x))))

    def _convolve(self, chunks: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv2d1(chunks))
        x = F.gelu(self.conv2d2(x))
        return F.gelu(self.conv2d3(x))


class TextModel(DecoderStack):
    """The Qwen3 decoder and its token embedding; named `model` in the checkpoint."""

    def __init__(self, config: AlignerConfig) -> None:
        super().__init__(config.text)
        self.embed_tokens = nn.Embedding(config.text.vocab_size, config.text.hidden_size)


class PrefillAttention:
    """Causal attention over a left-padded batch in one pass (`layers.AttentionBackend`), as transformers' SDPA
    path computes it: `is_causal` with grouped-query attention when no row is padded, else an explicit mask over
    repeated keys. A padding query attends to itself only, so its (unread) output stays finite."""

    def __init__(self, attention_mask: torch.Tensor) -> None:
        self.allowed: torch.Tensor | None = None
        if not bool(attention_mask.all()):
            length = attention_mask.shape[1]
            index = torch.arange(length, device=attention_mask.device)
            causal = index[None, :] <= index[:, None]
            allowed = causal[None] & attention_mask.bool()[:, None, :]
            self.allowed = (allowed | torch.eye(length, dtype=torch.bool, device=index.device)[None])[:, None]

    def __call__(self, layer_index: int, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> torch.Tensor:
        scale = query.shape[-1] ** -0.5
        num_heads = query.shape[1]
        if self.allowed is None:
            if _SDPA_HAS_GQA:
                return F.scaled_dot_product_attention(query, key, value, scale=scale, is_causal=True, enable_gqa=True)
            key, value = repeat_kv(key, num_heads), repeat_kv(value, num_heads)
            return F.scaled_dot_product_attention(query, key, value, scale=scale, is_causal=True)
        return F.scaled_dot_product_attention(query, repeat_kv(key, num_heads), repeat_kv(value, num_heads),
                                              attn_mask=self.allowed, scale=scale)


# Rows of an attention bias are padded to this many elements: the memory-efficient attention kernel reads a bias whose
# row stride it divides as it is, and copies any other into such a layout at every call.
_BIAS_ROW_ALIGNMENT = 16


def segment_bias(segment: torch.Tensor, is_causal: bool, dtype: torch.dtype) -> torch.Tensor:
    """Which keys each query of a packed sequence sees, as an additive attention bias [1, 1, S, S] in the
    attention's dtype: 0 for the keys of its own segment (`segment` [S]; -1: padding, nobody's key), and only
    earlier ones when causal; -inf for the rest. Every query sees itself, so that a padding query's (unread) output
    stays finite. It is the bias attention makes of the equivalent boolean mask at every call (zeros, then -inf
    where the mask is false), made once for all the layers; its rows lie in a wider buffer so that no call copies
    it again to align them."""
    length = segment.shape[0]
    index = torch.arange(length, device=segment.device)
    allowed = (segment[:, None] == segment[None, :]) & (segment[None, :] >= 0)
    if is_causal:
        allowed &= index[None, :] <= index[:, None]
    allowed |= index[:, None] == index[None, :]
    width = -(-length // _BIAS_ROW_ALIGNMENT) * _BIAS_ROW_ALIGNMENT
    bias = torch.zeros(length, width, dtype=dtype, device=segment.device)[:, :length]
    return bias.masked_fill_(allowed.logical_not(), float("-inf"))[None, None]


class PackedAttention:
    """Causal attention over prompts packed one after another into one row (`layers.AttentionBackend`), each
    attending to its own tokens only: shapes that depend on the packed length alone, as a captured graph needs."""

    def __init__(self, segment: torch.Tensor, dtype: torch.dtype) -> None:
        self.bias = segment_bias(segment, is_causal=True, dtype=dtype)

    def __call__(self, layer_index: int, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> torch.Tensor:
        num_heads = query.shape[1]
        return F.scaled_dot_product_attention(query, repeat_kv(key, num_heads), repeat_kv(value, num_heads),
                                              attn_mask=self.bias, scale=query.shape[-1] ** -0.5)


@dataclass
class PackedBatch:
    """A batch laid out in fixed shapes (`tts_service.runner.aligner_runner` packs it): C whole chunks of mel
    frames and their tokens' clips, and every prompt one after another in one row of M tokens."""

    chunks: torch.Tensor  # [C, mel bins, CHUNK_FRAMES]
    chunk_width: torch.Tensor  # [C]: the frames each chunk is padded to when its clip is encoded alone
    token_clip: torch.Tensor  # [C * tokens a chunk]: each encoder position's clip, -1 for none
    input_ids: torch.Tensor  # [M]
    positions: torch.Tensor  # [M]: each token's position in its own prompt
    segment: torch.Tensor  # [M]: each token's prompt, -1 for padding
    audio_source: torch.Tensor  # [M]: for an `<|audio_pad|>`, the encoder position whose token replaces it


class Thinker(nn.Module):
    def __init__(self, config: AlignerConfig) -> None:
        super().__init__()
        self.config = config
        self.audio_tower = AudioEncoder(config)
        self.model = TextModel(config)
        self.lm_head = nn.Linear(config.text.hidden_size, config.classify_num, bias=False)
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", rope_inverse_frequencies(config.text.head_dim, config.text.rope_theta),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                features: list[torch.Tensor]) -> torch.Tensor:
        """Left-padded prompts [B, T] (mask 1 on real tokens) and each prompt's log-mel frames [mel, frames], in
        order -> timestamp logits [B, T, classify_num]."""
        embeds = self.model.embed_tokens(input_ids)
        audio = torch.cat(self.audio_tower.encode_many(features)).to(embeds.dtype)
        placeholders = input_ids == self.config.audio_token_id
        if int(placeholders.sum()) != audio.shape[0]:
            raise ValueError(f"the prompts hold {int(placeholders.sum())} audio placeholders for "
                             f"{audio.shape[0]} audio tokens")
        embeds = embeds.masked_scatter(placeholders[..., None].expand_as(embeds), audio)
        # Real tokens count from 0 after the padding; padding sits at position 1, as in the reference.
        positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
        cos, sin = rope_cos_sin(self.inv_freq, positions, embeds.dtype)
        hidden = self.model.run_layers(embeds, cos, sin, PrefillAttention(attention_mask))
        return self.lm_head(hidden)


    def packed_classes(self, batch: PackedBatch) -> torch.Tensor:
        """The predicted class [M] at every position of a packed batch."""
        return self.packed_logits(batch).argmax(dim=-1)

    def packed_logits(self, batch: PackedBatch) -> torch.Tensor:
        """Timestamp logits [M, classify_num] at every position of a packed batch: the numbers `forward` gives each
        prompt, up to the rounding of kernels chosen for other shapes."""
        audio = self.audio_tower.encode_packed(batch.chunks, batch.chunk_width, batch.token_clip)
        embeds = self.model.embed_tokens(batch.input_ids)
        is_audio = (batch.input_ids == self.config.audio_token_id)[:, None]
        embeds = torch.where(is_audio, audio[batch.audio_source].to(embeds.dtype), embeds)
        cos, sin = rope_cos_sin(self.inv_freq, batch.positions[None], embeds.dtype)
        hidden = self.model.run_layers(embeds[None], cos, sin, PackedAttention(batch.segment, embeds.dtype))
        return self.lm_head(hidden[0])


class AlignerModel(nn.Module):
    """The checkpoint's root: everything lives under `thinker`."""

    def __init__(self, config: AlignerConfig) -> None:
        super().__init__()
        self.thinker = Thinker(config)


@dataclass
class LoadedAligner:
    """An aligner's network on its device and dtype, with the tokenizer and feature extractor beside it."""

    source: str
    config: AlignerConfig
    model: AlignerModel
    tokenizer: PreTrainedTokenizerFast
    feature_extractor: WhisperFeatureExtractor
    is_random: bool = False


def build_model(config: AlignerConfig, device: torch.device) -> AlignerModel:
    """A fresh model in float32 on `device`; weights are loaded or randomised afterwards."""
    with torch.device(device):
        return AlignerModel(config)


def finish_loading(source: str, config: AlignerConfig, model: AlignerModel, tokenizer: PreTrainedTokenizerFast,
                   feature_extractor: WhisperFeatureExtractor, dtype: torch.dtype,
                   is_random: bool = False) -> LoadedAligner:
    """Weights in place: cast to `dtype` (RoPE and position tables stay float32) and frozen for inference."""
    cast_weights_(model, dtype).eval().requires_grad_(False)
    return LoadedAligner(source, config, model, tokenizer, feature_extractor, is_random)


def feature_extractor_from(raw: dict[str, Any], config: AlignerConfig) -> WhisperFeatureExtractor:
    """The reference's feature extractor (transformers' WhisperFeatureExtractor) from `preprocessor_config.json`."""
    from transformers import WhisperFeatureExtractor

    check_preprocessor(raw, config)
    # The reference's processor names WhisperFeatureExtractor itself, whatever the file's feature_extractor_type.
    return WhisperFeatureExtractor.from_dict(dict(raw))


def load_aligner_checkpoint(directory: Path, device: torch.device, dtype: torch.dtype,
                            source: str | None = None) -> LoadedAligner:
    """The aligner checkpoint in `directory`, strictly: every tensor used, none missing or mis-shaped."""
    missing = [name for name in REQUIRED_FILES if not (directory / name).is_file()]
    if missing:
        raise CheckpointError(f"aligner checkpoint {directory} is incomplete: missing {', '.join(missing)}")
    try:
        config = AlignerConfig.parse(read_json(directory / ALIGNER_CONFIG_FILE))
        feature_extractor = feature_extractor_from(read_json(directory / PREPROCESSOR_CONFIG_FILE), config)
        tokenizer = load_text_tokenizer(directory)
    except (ConfigError, TextTokenizerError, FileNotFoundError) as error:  # each names its file
        raise CheckpointError(str(error)) from None
    model = build_model(config, device)
    tensors = read_tensors(directory / WEIGHTS_FILE)
    if not tensors:
        raise CheckpointError(f"aligner checkpoint {directory} is incomplete: missing {WEIGHTS_FILE}")
    load_strict(model, tensors, WEIGHTS_FILE)
    return finish_loading(source or str(directory), config, model, tokenizer, feature_extractor, dtype)
