"""The speech tokenizer's encoder: 24 kHz reference audio -> codec codes [frames, 16].

In-context voice cloning puts the reference clip's codes in the talker prompt. The encoder is the
encoding half of a Mimi codec (SEANet convolutions, a causal transformer, a strided downsampling
to 12.5 Hz, split residual vector quantisation), used from `transformers` as is; only the first
`encoder_valid_num_quantizers` codebooks are kept, which is what the talker predicts.

The state-dict keys are Mimi's own (`encoder.*`, `encoder_transformer.*`, `downsample.*`,
`quantizer.*`), i.e. the checkpoint's `encoder.*` keys without the prefix.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from tts_service.model.configs import SPEECH_TOKENIZER_CONFIG_FILE, ConfigError, ConfigSection, SpeechTokenizerConfig

if TYPE_CHECKING:
    from transformers import MimiConfig, MimiModel
    from transformers.models.mimi.modeling_mimi import MimiResidualVectorQuantizer

# The calibration signal for random codebooks: a dozen frames estimate a mean and a spread well enough.
_PROBE_SECONDS = 1.0
_PROBE_AMPLITUDE = 0.1
# Wider than any clip's encoder-transformer frames (25 per second), so no window ever binds: see
# `_encoder_only_mimi`. Kept within int32 for any attention kernel that takes the window as a C int.
_UNBOUNDED_ATTENTION_WINDOW = 2**31 - 1
# Mimi fields whose defaults are None or absent in some transformers release, so their type cannot
# be read off a default config.
_MIMI_NUMBER_FIELDS = frozenset({"_frame_rate", "frame_rate", "rope_theta"})
# Random centroids at half the spread of the vectors they quantise: close enough that the nearest
# one depends on the input, far enough apart that each stage still leaves a residual for the next.
_CENTROID_SPREAD = 0.5


def _mimi_library() -> types.ModuleType:
    # Imported on first use: transformers' modelling stack takes seconds to import, and only Base
    # checkpoints serving in-context cloning build this encoder.
    from transformers.models.mimi import modeling_mimi

    return modeling_mimi


def _check_mimi_field_type(fields: ConfigSection, key: str, default: object) -> None:
    if key in _MIMI_NUMBER_FIELDS or isinstance(default, float):
        fields.number(key)
    elif isinstance(default, bool):
        fields.boolean(key)
    elif isinstance(default, int):
        fields.integer(key)
    elif isinstance(default, str):
        fields.string(key)
    elif isinstance(default, list):
        fields.positives(key)


def _mimi_config(fields: ConfigSection) -> MimiConfig:
    """`encoder_config` as a MimiConfig; a value of the wrong type is a ConfigError naming its key.

    Each known field must have the JSON type of its default: transformers 4.x passes any value on to
    the modules (a string width fails deep inside torch) and 5.x reports it without the file.
    """
    library = _mimi_library()
    defaults = library.MimiConfig()
    for key, value in fields.raw.items():
        if value is not None:
            _check_mimi_field_type(fields, key, getattr(defaults, key, None))
    try:
        mimi = library.MimiConfig(**fields.raw)
    except Exception as error:
        # transformers 5.x validates values through huggingface_hub's strict dataclasses, whose
        # errors derive from Exception alone; 4.x raises ValueError.
        raise ConfigError(f"{fields.file}: {fields.path}: {error}") from error
    for key, value in fields.raw.items():
        # A null asks for the default, which only some fields derive (head_dim, codebook_dim, ...).
        if value is None and getattr(defaults, key, None) is not None and getattr(mimi, key, None) is None:
            raise fields.error(key, "must not be null")
    return mimi


def _validated_mimi_config(config: SpeechTokenizerConfig) -> MimiConfig:
    mimi = _mimi_config(ConfigSection(config.encoder, SPEECH_TOKENIZER_CONFIG_FILE, "encoder_config"))
    where = f"{SPEECH_TOKENIZER_CONFIG_FILE} encoder_config"
    if mimi.sampling_rate != config.input_sample_rate:
        raise ConfigError(f"{where}: sampling_rate {mimi.sampling_rate} differs from input_sample_rate "
                          f"{config.input_sample_rate}")
    if mimi.frame_size != config.samples_per_frame:
        raise ConfigError(f"{where}: one code frame spans {mimi.frame_size} samples, but the decoder expects "
                          f"{config.samples_per_frame}")
    if mimi.frame_rate * config.samples_per_frame != config.input_sample_rate:
        # Mimi builds its downsampling only when the frame rate differs from the convolutions' own rate.
        raise ConfigError(f"{where}: frame_rate {mimi.frame_rate} Hz differs from the decoder's "
                          f"{config.input_sample_rate / config.samples_per_frame} Hz")
    if not mimi.num_semantic_quantizers <= config.encoder_valid_num_quantizers <= mimi.num_quantizers:
        raise ConfigError(f"{SPEECH_TOKENIZER_CONFIG_FILE}: encoder_valid_num_quantizers "
                          f"{config.encoder_valid_num_quantizers} must lie "
                          f"between the semantic ({mimi.num_semantic_quantizers}) and total "
                          f"({mimi.num_quantizers}) quantizer counts")
    return mimi


@dataclass(frozen=True)
class _EncoderParts:
    """The encoding half's modules: SEANet convolutions, transformer, and the strided downsampling."""

    seanet: nn.Module
    transformer: nn.Module
    downsample: nn.Module


def _encoder_only_mimi(mimi_config: MimiConfig) -> tuple[MimiModel, _EncoderParts]:
    """A MimiModel that encodes, and its encoding half's modules, on either layout transformers has had.

    Transformers 4.x (and early 5.x) build one flat MimiModel holding both halves; newer 5.x releases
    split it into a MimiEncoderModel and a MimiDecoderModel, turn the flat attributes into read-only
    deprecated properties, and let a MimiConfig drop its decoder. The layout is recognised by that
    class, not by a version number, so every release in the declared range takes the path it supports.
    Either way `MimiModel.encode` runs the same modules in the same order.

    The attention window is lifted. The reference (qwen-tts, which pins transformers 4.57.3) masks the
    encoder transformer causally with no sliding window, because 4.57.3 applies `sliding_window` only
    on its flash-attention path; newer releases apply the configured window (250 frames, 10 s) on
    every path, which changes the codes of longer reference clips. With a window longer than any clip
    every release computes the reference's full causal attention, and 4.57.3 is unaffected.
    """
    library = _mimi_library()
    mimi_config.sliding_window = _UNBOUNDED_ATTENTION_WINDOW
    if hasattr(library, "MimiEncoderModel"):
        # The public way to build an encoder only: the decoder is never allocated.
        mimi_config.decoder_config = None
        mimi = _build_mimi(mimi_config)
        half = mimi.encoder
        return mimi, _EncoderParts(half.encoder_seanet, half.encoder_transformer, half.downsample)
    mimi = _build_mimi(mimi_config)
    parts = _EncoderParts(mimi.encoder, mimi.encoder_transformer, mimi.downsample)
    # The flat layout has no encoder-only constructor; the decoding half is built and let go.
    mimi.upsample = mimi.decoder_transformer = mimi.decoder = None
    return mimi, parts


def _build_mimi(mimi_config: MimiConfig) -> MimiModel:
    try:
        return _mimi_library().MimiModel(mimi_config)
    except ValueError as error:  # transformers 4.x checks some fields only here (codebook_size a power of 2)
        raise ConfigError(f"{SPEECH_TOKENIZER_CONFIG_FILE}: encoder_config: {error}") from error


class CodecEncoder(nn.Module):
    """Mimi's encoding half; `encode` turns one mono 24 kHz clip into codes [frames, num_quantizers]."""

    def __init__(self, config: SpeechTokenizerConfig) -> None:
        super().__init__()
        mimi, parts = _encoder_only_mimi(_validated_mimi_config(config))
        # Registered one by one under the checkpoint's (flat, transformers 4.x) names, so the keys carry
        # no extra prefix whatever the library nests them under; the MimiModel itself stays
        # unregistered (it would list every tensor twice) and supplies the `encode` logic.
        self.encoder = parts.seanet
        self.encoder_transformer = parts.transformer
        self.downsample = parts.downsample
        self.quantizer = mimi.quantizer
        self.__dict__["_mimi"] = mimi
        self.num_quantizers = config.encoder_valid_num_quantizers
        self.samples_per_frame = config.samples_per_frame

    def train(self, mode: bool = True) -> CodecEncoder:
        # The unregistered MimiModel must follow too: `encode` runs through it.
        super().train(mode)
        self._mimi.train(mode)
        return self

    @property
    def _weight(self) -> torch.Tensor:
        """A weight whose device and dtype the audio must follow (the reference uses the model dtype)."""
        return next(self.encoder.parameters())

    def num_frames(self, num_samples: int) -> int:
        """Codes kept for a clip: one per started frame, as the reference keeps."""
        return math.ceil(num_samples / self.samples_per_frame)

    @torch.inference_mode()
    def encode(self, wav_24k: torch.Tensor) -> torch.Tensor:
        """24 kHz mono float audio [T] -> int64 codes [ceil(T / 1920), num_quantizers] on the module device.

        The audio is cast to the weights' dtype first, as the reference does: bf16 weights encode bf16 audio.
        """
        if wav_24k.dim() != 1 or wav_24k.shape[0] == 0:
            raise ValueError(f"expected non-empty mono audio of shape [T], got {tuple(wav_24k.shape)}")
        self._forget_codebook_caches()
        weight = self._weight
        audio = wav_24k.to(device=weight.device, dtype=weight.dtype)[None, None]
        codes = self._mimi.encode(audio, num_quantizers=self.num_quantizers, return_dict=True).audio_codes
        return codes[0, :, : self.num_frames(wav_24k.shape[0])].transpose(0, 1)

    def _forget_codebook_caches(self) -> None:
        # Mimi memoises each codebook's centroids (embed_sum / cluster_usage) on first use and never
        # refreshes them, so weights loaded, randomised, cast or moved afterwards would be ignored.
        # Recomputing them costs far less than the convolutions of even a short clip.
        codebook_type = _mimi_library().MimiEuclideanCodebook
        for module in self.quantizer.modules():
            if isinstance(module, codebook_type):
                module._embed = None

    @torch.no_grad()
    def randomize_(self, generator: torch.Generator, std: float = 0.02) -> None:
        """Plausible random weights whose codes vary from frame to frame and codebook to codebook.

        Convolutions get 1/sqrt(fan_in) and transformer matrices `std`. Layer scales are raised
        tenfold from their initial value so the transformer visibly contributes. Codebooks cannot be
        drawn blindly: Mimi's own init leaves them at zero (every code 0), and centroids at the
        wrong scale or offset pick the same entry for every frame. So each quantizer is calibrated
        on a probe of random noise: centroids are spread around the vectors it actually receives.
        """
        layer_scale_type = _mimi_library().MimiLayerScale
        for module in self.modules():
            if isinstance(module, nn.Conv1d | nn.ConvTranspose1d):
                fan_in = module.in_channels // module.groups * module.kernel_size[0]
                module.weight.copy_(_randn(module.weight, generator) / math.sqrt(fan_in))
                if module.bias is not None:
                    module.bias.copy_(_randn(module.bias, generator) * std)
            elif isinstance(module, nn.Linear):
                module.weight.copy_(_randn(module.weight, generator) * std)
                if module.bias is not None:
                    module.bias.copy_(_randn(module.bias, generator) * std)
            elif isinstance(module, nn.LayerNorm):
                module.weight.copy_(1.0 + 0.1 * _randn(module.weight, generator))
                module.bias.copy_(_randn(module.bias, generator) * std)
            elif isinstance(module, layer_scale_type):
                initial = self._mimi.config.layer_scale_initial_scale
                module.scale.copy_(10 * initial * (1.0 + 0.2 * _randn(module.scale, generator)))
        self._calibrate_codebooks_(generator)

    def _calibrate_codebooks_(self, generator: torch.Generator) -> None:
        probe_length = int(_PROBE_SECONDS * self._mimi.config.sampling_rate)
        probe = _PROBE_AMPLITUDE * torch.randn(probe_length, generator=generator, device=generator.device)
        weight = self._weight
        audio = probe.to(device=weight.device, dtype=weight.dtype)[None, None]
        encoded = self.encoder_transformer(self.encoder(audio).transpose(1, 2))
        latents = self.downsample(encoded.last_hidden_state.transpose(1, 2))  # [1, hidden, frames]
        for rvq in (self.quantizer.semantic_residual_vector_quantizer,
                    self.quantizer.acoustic_residual_vector_quantizer):
            self._calibrate_rvq_(rvq, latents, generator)
        self._forget_codebook_caches()

    @staticmethod
    def _calibrate_rvq_(rvq: MimiResidualVectorQuantizer, latents: torch.Tensor,
                        generator: torch.Generator) -> None:
        projected = rvq.input_proj(latents) if rvq.input_proj is not None else latents
        vectors = projected[0].transpose(0, 1).float()  # [frames, dim]
        # The first stage sees the latents' offset; after it the residual is centred on zero.
        offset = vectors.mean(dim=0)
        spread = _CENTROID_SPREAD * (vectors - offset).std()
        for stage, layer in enumerate(rvq.layers):
            codebook = layer.codebook
            centroids = _randn(codebook.embed_sum, generator).float() * spread
            if stage == 0:
                centroids += offset
            # Trained codebooks hold running sums and usage counts; their ratio is the centroid.
            usage = 0.5 + 1.5 * torch.rand(codebook.cluster_usage.shape, generator=generator,
                                           device=generator.device).to(centroids)
            codebook.cluster_usage.copy_(usage)
            codebook.embed_sum.copy_(centroids * usage[:, None])


def _randn(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(like.shape, generator=generator, device=generator.device).to(like)
