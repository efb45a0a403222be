"""Frozen views of a checkpoint's `config.json` and `speech_tokenizer/config.json`.

Only the fields the model reads are kept; each is validated once, when parsed, its JSON type included,
and every error names the file and the key (`ConfigSection`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MODEL_TYPES = ("custom_voice", "voice_design", "base")
MODEL_CONFIG_FILE = "config.json"
SPEECH_TOKENIZER_CONFIG_FILE = "speech_tokenizer/config.json"

_MISSING: Any = object()


class ConfigError(ValueError):
    """A checkpoint config is missing a field or holds a value the model cannot use."""


def describe_json(value: object) -> str:
    """A JSON value's type in words, with the value as JSON when it is short: what an error shows of a bad field."""
    if value is None:
        return "null"
    kinds = ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
             (list, "an array"), (dict, "an object"))
    kind = next((word for python_type, word in kinds if isinstance(value, python_type)), type(value).__name__)
    shown = json.dumps(value, ensure_ascii=False, default=repr)
    return f"{kind} ({shown})" if len(shown) <= 40 else kind


def _is_integer(value: object) -> bool:
    # JSON true/false arrive as Python bools, which are ints too.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_number(value: object) -> bool:
    return _is_integer(value) or isinstance(value, float)


class ConfigSection:
    """One JSON object of a config file, read with its types checked.

    Every error names the file and the key's full path (`config.json: talker_config.hidden_size ...`).
    A field that is absent or null takes its default; without a default it is required.
    """

    def __init__(self, raw: object, file: str, path: str = "") -> None:
        if not isinstance(raw, dict):
            raise ConfigError(f"{file}: {path or 'the top level'} must be a JSON object, got {describe_json(raw)}")
        self.raw: dict[str, Any] = raw
        self.file = file
        self.path = path

    def key_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.file}: {self.key_path(key)} {message}")

    def _read(self, key: str, default: Any, is_valid: Callable[[object], bool], expected: str) -> Any:
        value = self.raw.get(key)
        if value is None and default is not _MISSING:
            return default
        if key not in self.raw:
            raise ConfigError(f"{self.file}: missing field {self.key_path(key)!r}")
        if value is None or not is_valid(value):
            raise self.error(key, f"must be {expected}, got {describe_json(value)}")
        return value

    def integer(self, key: str, default: int = _MISSING) -> int:
        return self._read(key, default, _is_integer, "an integer")

    def positive(self, key: str, default: int = _MISSING) -> int:
        return self._read(key, default, _is_positive, "a positive integer")

    def number(self, key: str, default: float = _MISSING) -> float:
        return float(self._read(key, default, _is_number, "a number"))

    def boolean(self, key: str, default: bool = _MISSING) -> bool:
        return self._read(key, default, lambda value: isinstance(value, bool), "true or false")

    def string(self, key: str, default: str = _MISSING) -> str:
        return self._read(key, default, lambda value: isinstance(value, str), "a string")

    def positives(self, key: str, default: tuple[int, ...] = _MISSING) -> tuple[int, ...]:
        def is_valid(value: object) -> bool:
            return isinstance(value, list) and all(_is_positive(item) for item in value)

        return tuple(self._read(key, default, is_valid, "an array of positive integers"))

    def integers(self, key: str, default: tuple[int, ...] = _MISSING) -> tuple[int, ...]:
        def is_valid(value: object) -> bool:
            return isinstance(value, list) and all(_is_integer(item) for item in value)

        return tuple(self._read(key, default, is_valid, "an array of integers"))

    def mapping(self, key: str, is_valid: Callable[[object], bool], expected: str) -> dict[str, Any]:
        """An object whose every value passes `is_valid`; absent or null is empty."""
        section = self.section(key, optional=True)
        for name, value in section.raw.items():
            if not is_valid(value):
                raise section.error(name, f"must be {expected}, got {describe_json(value)}")
        return dict(section.raw)

    def section(self, key: str, optional: bool = False) -> ConfigSection:
        """The object at `key`; an optional one that is absent or null reads as empty."""
        if key not in self.raw and not optional:
            raise ConfigError(f"{self.file}: missing field {self.key_path(key)!r}")
        value = self.raw.get(key)
        return ConfigSection({} if value is None and optional else value, self.file, self.key_path(key))


def _as_section(raw: object, file: str, path: str) -> ConfigSection:
    """A section as given, or a JSON object read as the section it stands for."""
    return raw if isinstance(raw, ConfigSection) else ConfigSection(raw, file, path)


@dataclass(frozen=True)
class AttentionStackShape:
    """The sizes of a Qwen3-style attention stack: the talker's, the code predictor's or the codec decoder's."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float

    @staticmethod
    def read_shape(raw: ConfigSection, defaults: Mapping[str, float]) -> dict[str, Any]:
        """The shape's fields as keywords; a key absent from `raw` takes its entry in `defaults` or is required."""
        def default(key: str) -> Any:
            return defaults.get(key, _MISSING)

        hidden_size = raw.positive("hidden_size", default("hidden_size"))
        heads = raw.positive("num_attention_heads", default("num_attention_heads"))
        key_value_heads = raw.positive("num_key_value_heads", heads)
        if heads % key_value_heads:
            raise raw.error("num_attention_heads", f"({heads}) must be a multiple of num_key_value_heads "
                                                   f"({key_value_heads})")
        return {
            "hidden_size": hidden_size,
            "intermediate_size": raw.positive("intermediate_size", default("intermediate_size")),
            "num_hidden_layers": raw.positive("num_hidden_layers", default("num_hidden_layers")),
            "num_attention_heads": heads,
            "num_key_value_heads": key_value_heads,
            "head_dim": raw.positive("head_dim", hidden_size // heads),
            "rms_norm_eps": raw.number("rms_norm_eps", default("rms_norm_eps")),
            "rope_theta": raw.number("rope_theta", 10000.0),
        }


@dataclass(frozen=True)
class DecoderLayerStack(AttentionStackShape):
    """The shape of a Qwen3-style decoder stack (talker or code predictor): the attention stack and its vocabulary."""

    vocab_size: int

    @classmethod
    def parse(cls, raw: ConfigSection) -> DecoderLayerStack:
        if raw.string("hidden_act", "silu") != "silu":
            raise raw.error("hidden_act", "must be 'silu', the only activation supported")
        if raw.boolean("attention_bias", False):
            raise raw.error("attention_bias", "is not supported")
        return cls(**cls.read_shape(raw, {"rms_norm_eps": 1e-6}), vocab_size=raw.positive("vocab_size"))


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
    def parse(cls, raw: ConfigSection | dict[str, Any]) -> TalkerConfig:
        """`talker_config`, as its section of `config.json` or as the JSON object."""
        raw = _as_section(raw, MODEL_CONFIG_FILE, "talker_config")
        layers = DecoderLayerStack.parse(raw)
        predictor = DecoderLayerStack.parse(raw.section("code_predictor_config"))
        rope_scaling = raw.section("rope_scaling", optional=True)
        mrope_section = rope_scaling.integers("mrope_section", ())
        if sum(mrope_section) != layers.head_dim // 2:
            raise rope_scaling.error("mrope_section", f"{list(mrope_section)} must sum to head_dim / 2 "
                                                      f"({layers.head_dim // 2})")
        speakers = {k.lower(): v for k, v in raw.mapping("spk_id", _is_integer, "an integer id").items()}
        # A speaker's dialect is the name of its language, or false (or null) for none.
        dialects = {k.lower(): (v or None) for k, v in raw.mapping(
            "spk_is_dialect", lambda value: value is None or value is False or isinstance(value, str),
            "a dialect name or false").items()}
        languages = {k.lower(): v for k, v in raw.mapping("codec_language_id", _is_integer, "an integer id").items()}
        for name, dialect in dialects.items():
            if dialect is not None and dialect not in languages:
                raise raw.error("spk_is_dialect", f"gives speaker {name!r} the unknown dialect {dialect!r}")
        config = cls(
            layers=layers,
            code_predictor=predictor,
            num_code_groups=raw.positive("num_code_groups"),
            text_hidden_size=raw.positive("text_hidden_size"),
            text_vocab_size=raw.positive("text_vocab_size"),
            mrope_section=mrope_section,
            mrope_interleaved=rope_scaling.boolean("interleaved", False),
            codec_bos_id=raw.integer("codec_bos_id"),
            codec_eos_id=raw.integer("codec_eos_token_id"),
            codec_pad_id=raw.integer("codec_pad_id"),
            codec_think_id=raw.integer("codec_think_id"),
            codec_nothink_id=raw.integer("codec_nothink_id"),
            codec_think_bos_id=raw.integer("codec_think_bos_id"),
            codec_think_eos_id=raw.integer("codec_think_eos_id"),
            codec_language_ids=languages,
            speaker_ids=speakers,
            speaker_dialects={name: dialects.get(name) for name in speakers},
        )
        for name in ("codec_bos_id", "codec_eos_id", "codec_pad_id", "codec_think_id", "codec_nothink_id",
                     "codec_think_bos_id", "codec_think_eos_id"):
            if not 0 <= getattr(config, name) < layers.vocab_size:
                raise raw.error(name, f"{getattr(config, name)} lies outside the codec vocabulary "
                                      f"({layers.vocab_size})")
        if predictor.vocab_size > layers.vocab_size:
            raise raw.error("code_predictor_config.vocab_size", "exceeds the talker's vocab_size")
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
    def parse(cls, raw: ConfigSection | dict[str, Any]) -> SpeakerEncoderConfig:
        """`speaker_encoder_config`, as its section of `config.json` or as the JSON object."""
        raw = _as_section(raw, MODEL_CONFIG_FILE, "speaker_encoder_config")
        values: dict[str, Any] = {}
        for name in cls.__dataclass_fields__:
            default = getattr(cls, name)
            values[name] = raw.positives(name, default) if isinstance(default, tuple) else raw.positive(name, default)
        config = cls(**values)
        if not len(config.enc_channels) == len(config.enc_kernel_sizes) == len(config.enc_dilations):
            raise raw.error("enc_channels", "enc_kernel_sizes and enc_dilations differ in length")
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
    def parse(cls, raw: object) -> ModelConfig:
        """The parsed `config.json` (a JSON value); raises ConfigError naming the key at fault."""
        section = ConfigSection(raw, MODEL_CONFIG_FILE)
        if section.string("tokenizer_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
            raise section.error("tokenizer_type", f"{section.raw['tokenizer_type']!r} is not supported; only the "
                                                  "12 Hz speech tokenizer (qwen3_tts_tokenizer_12hz) is")
        model_type = section.string("tts_model_type")
        if model_type not in MODEL_TYPES:
            raise section.error("tts_model_type", f"must be one of {MODEL_TYPES}, got {model_type!r}")
        talker = TalkerConfig.parse(section.section("talker_config"))
        speaker_encoder = None
        if model_type == "base":
            speaker_encoder = SpeakerEncoderConfig.parse(section.section("speaker_encoder_config"))
            if speaker_encoder.enc_dim != talker.layers.hidden_size:
                raise section.error("speaker_encoder_config.enc_dim", "must equal the talker hidden size "
                                                                      f"({talker.layers.hidden_size})")
        config = cls(
            model_type=model_type,
            model_size=section.string("tts_model_size", ""),
            talker=talker,
            speaker_encoder=speaker_encoder,
            im_start_token_id=section.integer("im_start_token_id", 151644),
            im_end_token_id=section.integer("im_end_token_id", 151645),
            tts_pad_token_id=section.integer("tts_pad_token_id", 151671),
            tts_bos_token_id=section.integer("tts_bos_token_id", 151672),
            tts_eos_token_id=section.integer("tts_eos_token_id", 151673),
        )
        for name in ("im_start_token_id", "im_end_token_id", "tts_pad_token_id", "tts_bos_token_id",
                     "tts_eos_token_id"):
            if not 0 <= getattr(config, name) < talker.text_vocab_size:
                raise section.error(name, f"{getattr(config, name)} lies outside the text vocabulary "
                                          f"({talker.text_vocab_size})")
        return config

    @property
    def accepts_instruction(self) -> bool:
        """The 0.6B CustomVoice model and the Base models were not trained with instructions."""
        if self.model_type == "voice_design":
            return True
        return self.model_type == "custom_voice" and self.model_size != "0b6"


@dataclass(frozen=True)
class CodecDecoderConfig(AttentionStackShape):
    """`decoder_config` of the 12 Hz speech tokenizer; its pre-transformer is the attention stack."""

    codebook_size: int
    codebook_dim: int
    latent_dim: int
    decoder_dim: int
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
    def parse(cls, raw: ConfigSection | dict[str, Any]) -> CodecDecoderConfig:
        """`decoder_config`, as its section of `speech_tokenizer/config.json` or as the JSON object."""
        raw = _as_section(raw, SPEECH_TOKENIZER_CONFIG_FILE, "decoder_config")
        shape = cls.read_shape(raw, {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 8,
                                     "num_attention_heads": 16, "rms_norm_eps": 1e-5})
        return cls(
            **shape,
            codebook_size=raw.positive("codebook_size", 2048),
            codebook_dim=raw.positive("codebook_dim", 512),
            latent_dim=raw.positive("latent_dim", 1024),
            decoder_dim=raw.positive("decoder_dim", 1536),
            sliding_window=raw.positive("sliding_window", 72),
            layer_scale_initial_scale=raw.number("layer_scale_initial_scale", 0.01),
            max_position_embeddings=raw.positive("max_position_embeddings", 8000),
            num_quantizers=raw.positive("num_quantizers", 16),
            num_semantic_quantizers=raw.integer("num_semantic_quantizers", 1),
            semantic_codebook_size=raw.positive("semantic_codebook_size", 4096),
            vector_quantization_hidden_dimension=raw.positive("vector_quantization_hidden_dimension", 512),
            upsample_rates=raw.positives("upsample_rates", (8, 5, 4, 3)),
            upsampling_ratios=raw.positives("upsampling_ratios", (2, 2)),
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
    def parse(cls, raw: object) -> SpeechTokenizerConfig:
        """The parsed `speech_tokenizer/config.json` (a JSON value); raises ConfigError naming the key at fault.

        `encoder_config` is only checked to be an object here: its fields are Mimi's, checked against
        transformers' MimiConfig when the codec encoder is built (`codec_encoder`).
        """
        section = ConfigSection(raw, SPEECH_TOKENIZER_CONFIG_FILE)
        if section.string("model_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
            raise section.error("model_type", "must be qwen3_tts_tokenizer_12hz: only the 12 Hz tokenizer is "
                                              "supported")
        decoder = CodecDecoderConfig.parse(section.section("decoder_config", optional=True))
        config = cls(
            decoder=decoder,
            encoder=dict(section.section("encoder_config", optional=True).raw),
            encoder_valid_num_quantizers=section.positive("encoder_valid_num_quantizers", 16),
            input_sample_rate=section.positive("input_sample_rate", 24000),
            output_sample_rate=section.positive("output_sample_rate", 24000),
            samples_per_frame=section.positive("decode_upsample_rate", 1920),
        )
        if decoder.samples_per_frame != config.samples_per_frame:
            raise section.error("decode_upsample_rate", f"({config.samples_per_frame}) does not match the decoder's "
                                                        f"upsampling ({decoder.samples_per_frame})")
        return config

    @property
    def frame_rate_hz(self) -> float:
        return self.output_sample_rate / self.samples_per_frame
