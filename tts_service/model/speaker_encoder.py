"""The Base models' speaker encoder: 24 kHz audio -> log-mel frames -> ECAPA-TDNN -> x-vector.

The x-vector (size `enc_dim`, the talker width) is what x-vector-only voice cloning feeds the
talker in place of a built-in speaker token. The front end is fixed by the released checkpoints:
1024-point STFT, hop 256, 128 Slaney mel bands up to 12 kHz, natural-log magnitude.

Parameter names follow the checkpoint's `speaker_encoder.*` keys (without the prefix). Every
convolution pads "same" by reflection, as the trained model did; this sets a minimum input length.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers.audio_utils import mel_filter_bank

from tts_service.model.configs import SpeakerEncoderConfig
from tts_service.model.log_mel import dft_basis, short_time_power

SAMPLE_RATE = 24000
N_FFT = 1024
HOP_LENGTH = 256
WIN_LENGTH = 1024
N_MELS = 128
F_MIN = 0.0
F_MAX = 12000.0
_LOG_FLOOR = 1e-5
_MAGNITUDE_EPS = 1e-9
_STD_FLOOR = 1e-12


@functools.lru_cache(maxsize=8)
def front_end_tables(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Mel filterbank [mels, bins] and Hann window, in fp32 whatever the model's dtype.

    They are cached per device rather than kept as buffers so that casting the module to bf16
    cannot round them: the reference always computes the spectrogram in fp32.
    """
    bank = mel_filter_bank(num_frequency_bins=N_FFT // 2 + 1, num_mel_filters=N_MELS, min_frequency=F_MIN,
                           max_frequency=F_MAX, sampling_rate=SAMPLE_RATE, norm="slaney", mel_scale="slaney")
    filters = torch.from_numpy(np.ascontiguousarray(bank.T, dtype=np.float32))
    window = torch.hann_window(WIN_LENGTH, dtype=torch.float32)
    return filters.to(device), window.to(device)


@functools.lru_cache(maxsize=8)
def transform_basis(device: torch.device) -> torch.Tensor:
    """The Hann window's short-time transform as a matrix (`log_mel.dft_basis`, float64), for the GPU's path."""
    return dft_basis(torch.hann_window(WIN_LENGTH, dtype=torch.float32)).to(device)


def log_mel_spectrogram(wav: torch.Tensor) -> torch.Tensor:
    """[B, T] 24 kHz audio -> [B, 128, frames] natural-log mel magnitudes, computed in fp32.

    The signal is reflect-padded by (n_fft - hop) / 2 on each side and the STFT is not centred,
    which gives T // 256 frames. The input is not clipped: values beyond [-1, 1] pass through.
    """
    filters, _ = front_end_tables(wav.device)
    pad = (N_FFT - HOP_LENGTH) // 2
    padded = F.pad(wav.float()[:, None], (pad, pad), mode="reflect")[:, 0]
    power = _power_by_product(padded) if padded.is_cuda else _power_by_stft(padded)
    magnitude = torch.sqrt(power + _MAGNITUDE_EPS)
    return torch.log(torch.clamp(filters @ magnitude, min=_LOG_FLOOR))


def _power_by_stft(padded: torch.Tensor) -> torch.Tensor:
    """[B, bins, frames] fp32, through `torch.stft` as the reference computes it (cuFFT on a GPU)."""
    _, window = front_end_tables(padded.device)
    spectrum = torch.stft(padded, N_FFT, hop_length=HOP_LENGTH, win_length=WIN_LENGTH, window=window,
                          center=False, normalized=False, onesided=True, return_complex=True)
    return spectrum.real.square() + spectrum.imag.square()


def _power_by_product(padded: torch.Tensor) -> torch.Tensor:
    """The same, as a float64 matrix product: on a GPU, no cuFFT (log_mel's docstring says why)."""
    return short_time_power(padded, transform_basis(padded.device), HOP_LENGTH).transpose(1, 2).float()


def _same_conv(in_channels: int, out_channels: int, kernel_size: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, padding="same",
                     padding_mode="reflect")


class TDNNBlock(nn.Module):
    """A dilated convolution followed by ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.conv = _same_conv(in_channels, out_channels, kernel_size, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2NetBlock(nn.Module):
    """Channels split into `scale` groups; each group after the first is convolved together with the
    previous group's output, which widens the receptive field step by step within one layer."""

    def __init__(self, channels: int, scale: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        width = channels // scale
        self.blocks = nn.ModuleList(TDNNBlock(width, width, kernel_size, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = torch.chunk(x, self.scale, dim=1)
        outputs = [groups[0]]
        previous: torch.Tensor | None = None
        for block, group in zip(self.blocks, groups[1:], strict=True):
            previous = block(group if previous is None else group + previous)
            outputs.append(previous)
        return torch.cat(outputs, dim=1)


class SqueezeExcitation(nn.Module):
    """Rescales each channel by a gate computed from the utterance-level channel means."""

    def __init__(self, channels: int, bottleneck: int) -> None:
        super().__init__()
        self.conv1 = _same_conv(channels, bottleneck)
        self.conv2 = _same_conv(bottleneck, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SERes2NetBlock(nn.Module):
    """1x1 TDNN -> Res2Net -> 1x1 TDNN -> squeeze-excitation, with a residual connection."""

    def __init__(self, channels: int, scale: int, se_channels: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TDNNBlock(channels, channels, 1, 1)
        self.res2net_block = Res2NetBlock(channels, scale, kernel_size, dilation)
        self.tdnn2 = TDNNBlock(channels, channels, 1, 1)
        self.se_block = SqueezeExcitation(channels, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _weighted_mean_std(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation over time under `weights` that sum to one over time."""
    mean = (weights * x).sum(dim=2)
    variance = (weights * (x - mean[..., None]).square()).sum(dim=2)
    return mean, torch.sqrt(variance.clamp(min=_STD_FLOOR))


class AttentiveStatisticsPooling(nn.Module):
    """Time pooling to [mean; std], weighted by an attention that also sees the global statistics."""

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TDNNBlock(channels * 3, attention_channels, 1, 1)
        self.conv = _same_conv(attention_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[2]
        uniform = torch.full((1, 1, frames), 1.0 / frames, dtype=x.dtype, device=x.device)
        mean, std = _weighted_mean_std(x, uniform)
        context = torch.cat([x, mean[..., None].expand_as(x), std[..., None].expand_as(x)], dim=1)
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _weighted_mean_std(x, attention)
        return torch.cat([mean, std], dim=1)[..., None]


def _check_config(config: SpeakerEncoderConfig) -> None:
    if config.sample_rate != SAMPLE_RATE or config.mel_dim != N_MELS:
        raise ValueError(f"the speaker encoder's front end is fixed at {SAMPLE_RATE} Hz and {N_MELS} mel "
                         f"bands; the config asks for {config.sample_rate} Hz and {config.mel_dim}")
    channels = config.enc_channels
    if len(channels) < 3:
        raise ValueError("the speaker encoder needs an input TDNN, at least one SE-Res2Net block and "
                         "the aggregation layer")
    inner = channels[1:-1]
    if any(c != channels[0] for c in inner):
        raise ValueError(f"SE-Res2Net blocks are residual, so their widths must equal the first: {channels}")
    if channels[0] % config.enc_res2net_scale:
        raise ValueError(f"width {channels[0]} is not divisible by res2net scale {config.enc_res2net_scale}")
    if sum(inner) != channels[-1]:
        raise ValueError(f"the aggregation layer takes the concatenated block outputs ({sum(inner)} "
                         f"channels) but is declared with {channels[-1]}")


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN: mel frames [B, 128, T] -> speaker embedding [B, enc_dim]."""

    def __init__(self, config: SpeakerEncoderConfig) -> None:
        super().__init__()
        _check_config(config)
        self.config = config
        channels, kernels, dilations = config.enc_channels, config.enc_kernel_sizes, config.enc_dilations
        self.blocks = nn.ModuleList([TDNNBlock(config.mel_dim, channels[0], kernels[0], dilations[0])])
        for index in range(1, len(channels) - 1):
            self.blocks.append(SERes2NetBlock(channels[index], config.enc_res2net_scale,
                                              config.enc_se_channels, kernels[index], dilations[index]))
        self.mfa = TDNNBlock(channels[-1], channels[-1], kernels[-1], dilations[-1])
        self.asp = AttentiveStatisticsPooling(channels[-1], config.enc_attention_channels)
        self.fc = _same_conv(channels[-1] * 2, config.enc_dim)

    @property
    def min_frames(self) -> int:
        """Reflection padding needs more frames than the widest one-sided pad of any convolution."""
        widest = max(d * (k - 1) - d * (k - 1) // 2
                     for k, d in zip(self.config.enc_kernel_sizes, self.config.enc_dilations, strict=True))
        return widest + 1

    @property
    def min_samples(self) -> int:
        """The shortest 24 kHz input `embed` accepts (a few tens of milliseconds)."""
        pad = (N_FFT - HOP_LENGTH) // 2
        return max(N_FFT - 2 * pad + (self.min_frames - 1) * HOP_LENGTH, pad + 1)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        x = mels
        block_outputs = []
        for block in self.blocks:
            x = block(x)
            block_outputs.append(x)
        # Multi-layer aggregation: every SE-Res2Net block's output, the input TDNN's excluded.
        x = self.mfa(torch.cat(block_outputs[1:], dim=1))
        return self.fc(self.asp(x))[..., 0]

    @torch.inference_mode()
    def embed(self, wav_24k: torch.Tensor) -> torch.Tensor:
        """24 kHz mono float audio [T] -> speaker embedding [enc_dim], on this module's device and dtype.

        The spectrogram is computed in fp32 and only then cast to the weights' dtype, as the reference does.
        """
        if wav_24k.dim() != 1:
            raise ValueError(f"expected mono audio of shape [T], got {tuple(wav_24k.shape)}")
        if wav_24k.shape[0] < self.min_samples:
            needed_ms = self.min_samples / SAMPLE_RATE * 1000
            raise ValueError(f"reference audio too short for the speaker encoder: {wav_24k.shape[0]} "
                             f"samples, at least {self.min_samples} ({needed_ms:.0f} ms) needed")
        weight = self.fc.weight
        mels = log_mel_spectrogram(wav_24k.to(weight.device)[None])
        return self(mels.to(weight.dtype))[0]

    @torch.no_grad()
    def randomize_(self, generator: torch.Generator, std: float = 0.02) -> None:
        """Plausible random weights: 1/sqrt(fan_in) convolution filters with zero mean, biases `std`.

        A fixed std would shrink or blow up the signal across fan-ins from 8 to 3k. Centring each
        filter matters as much: log-mels sit far below zero and ReLU features far above it, and a
        random filter passes that common offset on, so every embedding came out nearly the same
        (cosine 0.9999 between a chirp and white noise). Centred, they differ as speakers would.
        """
        for module in self.modules():
            if isinstance(module, nn.Conv1d):
                fan_in = module.in_channels // module.groups * module.kernel_size[0]
                weight = _randn(module.weight, generator)
                if fan_in > 1:
                    weight -= weight.mean(dim=(1, 2), keepdim=True)
                module.weight.copy_(weight / math.sqrt(fan_in))
                if module.bias is not None:
                    module.bias.copy_(_randn(module.bias, generator) * std)


def _randn(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(like.shape, generator=generator, device=generator.device).to(like)
