"""A frozen view of a Qwen3-ForcedAligner checkpoint's `config.json` (and the checks on its `preprocessor_config.json`).

The published layout is the Qwen3-ASR one (`model_type: qwen3_asr`): `thinker_config` holds an audio encoder
(`audio_config`), a Qwen3 text model (`text_config`) and, for the aligner, `classify_num` timestamp classes in place
of the vocabulary head; `timestamp_token_id` and `timestamp_segment_time` sit at the top level. A key that is absent
takes the default of the official configuration classes (qwen-asr 0.0.6), so a config that the reference reads the
same way reads the same here; every error names the file and the key (`ConfigSection`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tts_service.model.configs import ConfigSection, DecoderLayerStack, describe_json

ALIGNER_CONFIG_FILE = "config.json"
PREPROCESSOR_CONFIG_FILE = "preprocessor_config.json"
# The reference resamples every clip to 16 kHz and hands the feature extractor that rate.
SAMPLE_RATE = 16000
# The reference counts an audio's tokens per 100 mel frames (13 each) with these constants written out, whatever
# `n_window` says, so only the window it was written for (2 * 50 frames) gives the encoder's own count.
CHUNK_FRAMES = 100
_SUPPORTED_N_WINDOW = CHUNK_FRAMES // 2

# Qwen3ASRAudioEncoderConfig's defaults.
_AUDIO_DEFAULTS: dict[str, Any] = {
    "num_mel_bins": 128, "encoder_layers": 32, "encoder_attention_heads": 20, "encoder_ffn_dim": 5120,
    "d_model": 1280, "activation_function": "gelu", "max_source_positions": 1500, "n_window": 100,
    "output_dim": 3584, "n_window_infer": 400, "conv_chunksize": 500, "downsample_hidden_size": 480,
}
# Qwen3ASRTextConfig's defaults (head_dim is its own field there, not hidden_size / heads).
_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "hidden_act": "silu",
    "rms_norm_eps": 1e-6, "rope_theta": 5000000.0, "attention_bias": False,
}
# Qwen3ASRThinkerConfig's defaults.
_AUDIO_TOKEN_ID = 151646
_AUDIO_START_TOKEN_ID = 151647


def _with_defaults(section: ConfigSection, defaults: Mapping[str, Any]) -> ConfigSection:
    """`section` with each absent or null key set to the official default; errors still name the file and key."""
    given = {key: value for key, value in section.raw.items() if value is not None}
    return ConfigSection({**defaults, **given}, section.file, section.path)


def conv_output_length(frames: int) -> int:
    """Frames left after the encoder's three stride-2 convolutions (kernel 3, padding 1); 0 stays 0."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1
    return frames


def audio_token_count(frames: int) -> int:
    """How many audio tokens a clip of `frames` mel frames becomes: each full chunk, then the rest, convolved alone."""
    full, rest = divmod(frames, CHUNK_FRAMES)
    return full * conv_output_length(CHUNK_FRAMES) + conv_output_length(rest)


@dataclass(frozen=True)
class AudioEncoderConfig:
    """`thinker_config.audio_config`: a Whisper-like encoder over chunks of mel frames."""

    num_mel_bins: int
    d_model: int
    encoder_layers: int
    encoder_attention_heads: int
    encoder_ffn_dim: int
    output_dim: int  # the width of an audio token as the text model reads it
    downsample_hidden_size: int  # channels of the three stride-2 convolutions over each chunk
    max_source_positions: int  # sinusoid positions: at least the tokens of one chunk
    n_window: int  # half a chunk in mel frames; only 50 (100-frame chunks) is what the reference counts by
    conv_chunksize: int  # chunks convolved in one call, which bounds the convolution's memory

    @classmethod
    def parse(cls, raw: ConfigSection) -> AudioEncoderConfig:
        raw = _with_defaults(raw, _AUDIO_DEFAULTS)
        if raw.string("activation_function") != "gelu":
            raise raw.error("activation_function", "must be 'gelu', the only activation supported")
        config = cls(**{name: raw.positive(name) for name in cls.__dataclass_fields__})
        if config.d_model % config.encoder_attention_heads:
            raise raw.error("d_model", f"({config.d_model}) must be a multiple of encoder_attention_heads "
                                       f"({config.encoder_attention_heads})")
        if config.n_window != _SUPPORTED_N_WINDOW:
            raise raw.error("n_window", f"must be {_SUPPORTED_N_WINDOW}, got {config.n_window}: the reference counts "
                                        f"audio tokens per {CHUNK_FRAMES} mel frames whatever it says")
        if config.max_source_positions < conv_output_length(CHUNK_FRAMES):
            raise raw.error("max_source_positions", f"({config.max_source_positions}) must cover the "
                                                    f"{conv_output_length(CHUNK_FRAMES)} tokens of a chunk")
        return config

    @property
    def head_dim(self) -> int:
        return self.d_model // self.encoder_attention_heads

    @property
    def conv_out_features(self) -> int:
        """The width of one frame after the convolutions: channels times the mel bins left (halved three times)."""
        return self.downsample_hidden_size * conv_output_length(self.num_mel_bins)


@dataclass(frozen=True)
class AlignerConfig:
    """The root `config.json` of a Qwen3-ForcedAligner checkpoint."""

    audio: AudioEncoderConfig
    text: DecoderLayerStack
    classify_num: int
    audio_token_id: int
    audio_start_token_id: int
    timestamp_token_id: int
    # Milliseconds per timestamp class (80 in the published checkpoint).
    timestamp_segment_ms: float
    support_languages: tuple[str, ...]

    @classmethod
    def parse(cls, raw: object) -> AlignerConfig:
        """The parsed `config.json` (a JSON value); raises ConfigError naming the key at fault."""
        section = ConfigSection(raw, ALIGNER_CONFIG_FILE)
        if section.string("model_type", "qwen3_asr") != "qwen3_asr":
            raise section.error("model_type", f"must be 'qwen3_asr', got {section.raw['model_type']!r}")
        thinker = section.section("thinker_config")
        # The reference builds the timestamp head only for a thinker whose model_type names the aligner; any other
        # is a speech recogniser, whose head is the vocabulary.
        if "forced_aligner" not in thinker.string("model_type", "qwen3_asr_thinker"):
            raise thinker.error("model_type", "must name the forced aligner ('qwen3_forced_aligner'), got "
                                              f"{describe_json(thinker.raw.get('model_type'))}")
        audio = AudioEncoderConfig.parse(thinker.section("audio_config", optional=True))
        text_section = _with_defaults(thinker.section("text_config", optional=True), _TEXT_DEFAULTS)
        text = DecoderLayerStack.parse(text_section)
        _check_rope_scaling(text_section.section("rope_scaling", optional=True))
        if audio.output_dim != text.hidden_size:
            raise thinker.error("audio_config.output_dim", f"({audio.output_dim}) must equal text_config.hidden_size "
                                                           f"({text.hidden_size}): audio tokens replace text tokens")
        config = cls(
            audio=audio,
            text=text,
            classify_num=thinker.positive("classify_num"),
            audio_token_id=thinker.integer("audio_token_id", _AUDIO_TOKEN_ID),
            audio_start_token_id=thinker.integer("audio_start_token_id", _AUDIO_START_TOKEN_ID),
            timestamp_token_id=section.integer("timestamp_token_id"),
            timestamp_segment_ms=section.number("timestamp_segment_time"),
            support_languages=_strings(section, "support_languages"),
        )
        for where, name in ((thinker, "audio_token_id"), (thinker, "audio_start_token_id"),
                            (section, "timestamp_token_id")):
            if not 0 <= getattr(config, name) < text.vocab_size:
                raise where.error(name, f"{getattr(config, name)} lies outside the text vocabulary ({text.vocab_size})")
        if config.timestamp_segment_ms <= 0:
            raise section.error("timestamp_segment_time", f"must be positive, got {config.timestamp_segment_ms}")
        return config

    @property
    def max_time_s(self) -> float:
        """The latest time a timestamp class can stand for."""
        return (self.classify_num - 1) * self.timestamp_segment_ms / 1000.0


def _check_rope_scaling(rope_scaling: ConfigSection) -> None:
    # The aligner gives all three MRoPE position streams the same position, so interleaved MRoPE is plain RoPE
    # and `mrope_section` changes nothing; only a scaled RoPE would change the angles.
    rope_type = rope_scaling.string("rope_type", rope_scaling.string("type", "default"))
    if rope_type != "default":
        raise rope_scaling.error("rope_type", f"must be 'default', got {rope_type!r}")


def _strings(section: ConfigSection, key: str) -> tuple[str, ...]:
    value = section.raw.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise section.error(key, f"must be an array of strings, got {describe_json(value)}")
    return tuple(value)


def check_preprocessor(raw: object, config: AlignerConfig) -> None:
    """The feature extractor's settings that the model depends on: its mel bins and its sampling rate."""
    section = ConfigSection(raw, PREPROCESSOR_CONFIG_FILE)
    feature_size = section.positive("feature_size", 80)
    if feature_size != config.audio.num_mel_bins:
        raise section.error("feature_size", f"({feature_size}) must equal {ALIGNER_CONFIG_FILE}'s "
                                            f"thinker_config.audio_config.num_mel_bins ({config.audio.num_mel_bins})")
    sampling_rate = section.positive("sampling_rate", SAMPLE_RATE)
    if sampling_rate != SAMPLE_RATE:
        raise section.error("sampling_rate", f"must be {SAMPLE_RATE}, the rate the reference resamples every clip "
                                             f"to, got {sampling_rate}")

