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
from typing import TYPE_CHECKING

import torch
from torch import nn

from tts_service.model.configs import ConfigError, SpeechTokenizerConfig

if TYPE_CHECKING:
    from transformers import MimiConfig
    from transformers.models.mimi.modeling_mimi import MimiResidualVectorQuantizer

# The calibration signal for random codebooks: a dozen frames estimate a mean and a spread well enough.
_PROBE_SECONDS = 1.0
_PROBE_AMPLITUDE = 0.1
# Random centroids at half the spread of the vectors they quantise: close enough that the nearest
# one depends on the input, far enough apart that each stage still leaves a residual for the next.
_CENTROID_SPREAD = 0.5


def _mimi_library() -> types.ModuleType:
    # Imported on first use: transformers' modelling stack takes seconds to import, and only Base
    # checkpoints serving in-context cloning build this encoder.
    from transformers.models.mimi import modeling_mimi

    return modeling_mimi


def _validated_mimi_config(config: SpeechTokenizerConfig) -> MimiConfig:
    mimi = _mimi_library().MimiConfig(**config.encoder)
    where = "speech_tokenizer/config.json encoder_config"
    if mimi.sampling_rate != config.input_sample_rate:
        raise ConfigError(f"{where}: sampling_rate {mimi.sampling_rate} differs from input_sample_rate "
                          f"{config.input_sample_rate}")
    if mimi.frame_size != config.samples_per_frame:
        raise ConfigError(f"{where}: one code frame spans {mimi.frame_size} samples, but the decoder expects "
                          f"{config.samples_per_frame}")
    if not mimi.num_semantic_quantizers <= config.encoder_valid_num_quantizers <= mimi.num_quantizers:
        raise ConfigError(f"encoder_valid_num_quantizers {config.encoder_valid_num_quantizers} must lie "
                          f"between the semantic ({mimi.num_semantic_quantizers}) and total "
                          f"({mimi.num_quantizers}) quantizer counts")
    return mimi


class CodecEncoder(nn.Module):
    """Mimi's encoding half; `encode` turns one mono 24 kHz clip into codes [frames, num_quantizers]."""

    def __init__(self, config: SpeechTokenizerConfig) -> None:
        super().__init__()
        mimi = _mimi_library().MimiModel(_validated_mimi_config(config))
        mimi.upsample = mimi.decoder_transformer = mimi.decoder = None
        # Registered one by one so the keys carry no extra prefix; the MimiModel itself stays
        # unregistered (it would list every tensor twice) and supplies the `encode` logic.
        self.encoder = mimi.encoder
        self.encoder_transformer = mimi.encoder_transformer
        self.downsample = mimi.downsample
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
        encoded = self.encoder_transformer(self.encoder(audio).transpose(1, 2), return_dict=True)
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
