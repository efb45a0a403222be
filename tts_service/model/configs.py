"""Frozen views of a checkpoint's `config.json` and `speech_tokenizer/config.json`.

Only the fields the model reads are kept; each is validated once, when parsed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MODEL_TYPES = ("custom_voice", "voice_design", "base")


class ConfigError(ValueError):
    """A checkpoint config is missing a field or holds a value the model cannot use."""


def _require(raw: dict[str, Any], key: str, where: str) -> Any:
    if key not in raw:
        raise ConfigError(f"{where}: missing field {key!r}")
    return raw[key]


def _positive(value: int, name: str) -> int:
    if not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class DecoderLayerStack:
    """The shape of a Qwen3-style decoder stack (talker or code predictor)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size"):
            _positive(getattr(self, name), name)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError("num_attention_heads must be a multiple of num_key_value_heads")

    @classmethod
    def parse(cls, raw: dict[str, Any], where: str) -> DecoderLayerStack:
        if raw.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{where}: only hidden_act 'silu' is supported")
        if raw.get("attention_bias", False):
            raise ConfigError(f"{where}: attention_bias is not supported")
        heads = _require(raw, "num_attention_heads", where)
        return cls(
            hidden_size=_require(raw, "hidden_size", where),
            intermediate_size=_require(raw, "intermediate_size", where),
            num_hidden_layers=_require(raw, "num_hidden_layers", where),
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads", heads),
            head_dim=raw.get("head_dim") or _require(raw, "hidden_size", where) // heads,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            vocab_size=_require(raw, "vocab_size", where),
        )


@dataclass(frozen=True)
class TalkerConfig:
    layers: DecoderLayerStack
    code_predictor: DecoderLayerStack
    num_code_groups: int
    text_hidden_size: int
    text_vocab_size: int
    mrope_section: tuple[int, ...]
    mrope_interleaved: bool
    codec_bos_id: int
    codec_eos_id: int
    codec_pad_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    codec_language_ids: dict[str, int] = field(hash=False)
    speaker_ids: dict[str, int] = field(hash=False)
    speaker_dialects: dict[str, str | None] = field(hash=False)

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> TalkerConfig:
        where = "talker_config"
        layers = DecoderLayerStack.parse(raw, where)
        predictor = DecoderLayerStack.parse(_require(raw, "code_predictor_config", where),
                                            "talker_config.code_predictor_config")
        rope_scaling = raw.get("rope_scaling") or {}
        mrope_section = tuple(rope_scaling.get("mrope_section", ()))
        if sum(mrope_section) != layers.head_dim // 2:
            raise ConfigError(f"{where}: mrope_section {mrope_section} must sum to head_dim / 2")
        num_code_groups = _positive(_require(raw, "num_code_groups", where), "num_code_groups")
        speakers = {k.lower(): int(v) for k, v in (raw.get("spk_id") or {}).items()}
        dialects = {k.lower(): (v or None) for k, v in (raw.get("spk_is_dialect") or {}).items()}
        languages = {k.lower(): int(v) for k, v in (raw.get("codec_language_id") or {}).items()}
        for name, dialect in dialects.items():
            if dialect is not None and dialect not in languages:
                raise ConfigError(f"{where}: speaker {name!r} names unknown dialect {dialect!r}")
        config = cls(
            layers=layers,
            code_predictor=predictor,
            num_code_groups=num_code_groups,
            text_hidden_size=_require(raw, "text_hidden_size", where),
            text_vocab_size=_require(raw, "text_vocab_size", where),
            mrope_section=mrope_section,
            mrope_interleaved=bool(rope_scaling.get("interleaved", False)),
            codec_bos_id=_require(raw, "codec_bos_id", where),
            codec_eos_id=_require(raw, "codec_eos_token_id", where),
            codec_pad_id=_require(raw, "codec_pad_id", where),
            codec_think_id=_require(raw, "codec_think_id", where),
            codec_nothink_id=_require(raw, "codec_nothink_id", where),
            codec_think_bos_id=_require(raw, "codec_think_bos_id", where),
            codec_think_eos_id=_require(raw, "codec_think_eos_id", where),
            codec_language_ids=languages,
            speaker_ids=speakers,
            speaker_dialects={name: dialects.get(name) for name in speakers},
        )
        for name in ("codec_bos_id", "codec_eos_id", "codec_pad_id", "codec_think_id", "codec_nothink_id",
                     "codec_think_bos_id", "codec_think_eos_id"):
            if not 0 <= getattr(config, name) < layers.vocab_size:
                raise ConfigError(f"{where}: {name} outside the codec vocabulary")
        if predictor.vocab_size > layers.vocab_size:
            raise ConfigError(f"{where}: the code predictor vocabulary exceeds the talker's")
        return config

    @property
    def languages(self) -> tuple[str, ...]:
        """Languages a request may name; dialects are chosen through their speakers."""
        return ("auto", *(name for name in self.codec_language_ids if "dialect" not in name))

    @property
    def has_mtp_projection(self) -> bool:
        return self.code_predictor.hidden_size != self.layers.hidden_size


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> SpeakerEncoderConfig:
        defaults = cls()
        values = {name: raw.get(name, getattr(defaults, name)) for name in cls.__dataclass_fields__}
        for name in ("enc_channels", "enc_kernel_sizes", "enc_dilations"):
            values[name] = tuple(values[name])
        config = cls(**values)
        if not len(config.enc_channels) == len(config.enc_kernel_sizes) == len(config.enc_dilations):
            raise ConfigError("speaker_encoder_config: channel, kernel and dilation lists differ in length")
        return config


@dataclass(frozen=True)
class ModelConfig:
    """The root `config.json` of a Qwen3-TTS checkpoint."""

    model_type: str
    model_size: str
    talker: TalkerConfig
    speaker_encoder: SpeakerEncoderConfig | None
    im_start_token_id: int
    im_end_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> ModelConfig:
        where = "config.json"
        if raw.get("tokenizer_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
            raise ConfigError(f"{where}: only the 12 Hz speech tokenizer is supported, "
                              f"got tokenizer_type {raw.get('tokenizer_type')!r}")
        model_type = _require(raw, "tts_model_type", where)
        if model_type not in MODEL_TYPES:
            raise ConfigError(f"{where}: tts_model_type must be one of {MODEL_TYPES}, got {model_type!r}")
        talker = TalkerConfig.parse(_require(raw, "talker_config", where))
        speaker_encoder = None
        if model_type == "base":
            speaker_encoder = SpeakerEncoderConfig.parse(_require(raw, "speaker_encoder_config", where))
            if speaker_encoder.enc_dim != talker.layers.hidden_size:
                raise ConfigError(f"{where}: speaker_encoder_config.enc_dim must equal the talker hidden size")
        config = cls(
            model_type=model_type,
            model_size=raw.get("tts_model_size", ""),
            talker=talker,
            speaker_encoder=speaker_encoder,
            im_start_token_id=raw.get("im_start_token_id", 151644),
            im_end_token_id=raw.get("im_end_token_id", 151645),
            tts_pad_token_id=raw.get("tts_pad_token_id", 151671),
            tts_bos_token_id=raw.get("tts_bos_token_id", 151672),
            tts_eos_token_id=raw.get("tts_eos_token_id", 151673),
        )
        for name in ("im_start_token_id", "im_end_token_id", "tts_pad_token_id", "tts_bos_token_id",
                     "tts_eos_token_id"):
            if not 0 <= getattr(config, name) < talker.text_vocab_size:
                raise ConfigError(f"{where}: {name} outside the text vocabulary")
        return config

    @property
    def accepts_instruction(self) -> bool:
        """The 0.6B CustomVoice model and the Base models were not trained with instructions."""
        if self.model_type == "voice_design":
            return True
        return self.model_type == "custom_voice" and self.model_size != "0b6"


@dataclass(frozen=True)
class CodecDecoderConfig:
    """`decoder_config` of the 12 Hz speech tokenizer."""

    codebook_size: int
    codebook_dim: int
    latent_dim: int
    decoder_dim: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    sliding_window: int
    layer_scale_initial_scale: float
    max_position_embeddings: int
    num_quantizers: int
    num_semantic_quantizers: int
    semantic_codebook_size: int
    vector_quantization_hidden_dimension: int
    upsample_rates: tuple[int, ...]
    upsampling_ratios: tuple[int, ...]

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> CodecDecoderConfig:
        where = "speech_tokenizer/config.json decoder_config"
        heads = raw.get("num_attention_heads", 16)
        hidden = raw.get("hidden_size", 1024)
        return cls(
            codebook_size=raw.get("codebook_size", 2048),
            codebook_dim=raw.get("codebook_dim", 512),
            latent_dim=raw.get("latent_dim", 1024),
            decoder_dim=raw.get("decoder_dim", 1536),
            hidden_size=hidden,
            intermediate_size=raw.get("intermediate_size", 3072),
            num_hidden_layers=raw.get("num_hidden_layers", 8),
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads", heads),
            head_dim=raw.get("head_dim") or hidden // heads,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            sliding_window=_positive(raw.get("sliding_window", 72), f"{where}.sliding_window"),
            layer_scale_initial_scale=float(raw.get("layer_scale_initial_scale", 0.01)),
            max_position_embeddings=raw.get("max_position_embeddings", 8000),
            num_quantizers=raw.get("num_quantizers", 16),
            num_semantic_quantizers=raw.get("num_semantic_quantizers", 1),
            semantic_codebook_size=raw.get("semantic_codebook_size", 4096),
            vector_quantization_hidden_dimension=raw.get("vector_quantization_hidden_dimension", 512),
            upsample_rates=tuple(raw.get("upsample_rates", (8, 5, 4, 3))),
            upsampling_ratios=tuple(raw.get("upsampling_ratios", (2, 2))),
        )

    @property
    def samples_per_frame(self) -> int:
        total = 1
        for factor in (*self.upsample_rates, *self.upsampling_ratios):
            total *= factor
        return total


@dataclass(frozen=True)
class SpeechTokenizerConfig:
    decoder: CodecDecoderConfig
    encoder: dict[str, Any] = field(hash=False)
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    samples_per_frame: int = 1920

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> SpeechTokenizerConfig:
        if raw.get("model_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
            raise ConfigError("speech_tokenizer/config.json: only the 12 Hz tokenizer is supported")
        decoder = CodecDecoderConfig.parse(raw.get("decoder_config") or {})
        config = cls(
            decoder=decoder,
            encoder=dict(raw.get("encoder_config") or {}),
            encoder_valid_num_quantizers=raw.get("encoder_valid_num_quantizers", 16),
            input_sample_rate=raw.get("input_sample_rate", 24000),
            output_sample_rate=raw.get("output_sample_rate", 24000),
            samples_per_frame=raw.get("decode_upsample_rate", 1920),
        )
        if decoder.samples_per_frame != config.samples_per_frame:
            raise ConfigError("speech_tokenizer/config.json: decode_upsample_rate does not match the decoder's "
                              f"upsampling ({decoder.samples_per_frame})")
        return config

    @property
    def frame_rate_hz(self) -> float:
        return self.output_sample_rate / self.samples_per_frame
