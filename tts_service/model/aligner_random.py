"""Random-weight Qwen3-ForcedAligner checkpoints at the published shapes (`0.6b`) or tiny ones for CPU tests (`tiny`).

As for the TTS model (`random_checkpoint`), identical random weights loaded by this service and by the reference
package (qwen-asr) are how fidelity is proven without the real weights. The same builder writes a checkpoint
directory in the published layout (config.json, generation_config.json, preprocessor_config.json, the Qwen2 text
tokenizer's three files, model.safetensors) or builds the aligner in memory (`random:tiny`).

The tokenizer is the TTS one's trained stand-in (`text_tokenizer.write_text_tokenizer`) with the Qwen3-ASR special
block laid out at the configured ids, and the processor's audio tokens named in its config as Qwen3ASRProcessor
expects them.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tts_service.model.aligner_config import ALIGNER_CONFIG_FILE, PREPROCESSOR_CONFIG_FILE, SAMPLE_RATE, AlignerConfig
from tts_service.model.aligner_model import (
    WEIGHTS_FILE,
    AlignerModel,
    LoadedAligner,
    build_model,
    feature_extractor_from,
    finish_loading,
)
from tts_service.model.random_checkpoint import randomize_, write_json, writer_command
from tts_service.model.text_tokenizer import CONFIG_FILE, load_text_tokenizer, write_text_tokenizer

PRESETS = ("tiny", "0.6b")

# The published config.json's fields (the configuration classes' boilerplate left out).
_REAL_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ASRForConditionalGeneration"],
    "model_type": "qwen3_asr",
    "timestamp_token_id": 151705,
    "timestamp_segment_time": 80,
    "support_languages": ["Chinese", "Cantonese", "English", "German", "Spanish", "French", "Italian", "Portuguese",
                          "Russian", "Korean", "Japanese"],
    "thinker_config": {
        "model_type": "qwen3_forced_aligner",
        "architectures": ["Qwen3ASRForConditionalGeneration"],
        "classify_num": 5000,
        "audio_start_token_id": 151669,
        "audio_end_token_id": 151670,
        "audio_token_id": 151676,
        "dtype": "bfloat16",
        "initializer_range": 0.02,
        "audio_config": {
            "model_type": "qwen3_asr_audio_encoder", "activation_function": "gelu", "activation_dropout": 0,
            "attention_dropout": 0, "dropout": 0, "conv_chunksize": 500, "d_model": 1024,
            "downsample_hidden_size": 480, "encoder_attention_heads": 16, "encoder_ffn_dim": 4096,
            "encoder_layers": 24, "num_hidden_layers": 24, "max_source_positions": 1500, "n_window": 50,
            "n_window_infer": 800, "num_mel_bins": 128, "output_dim": 1024, "scale_embedding": False,
            "initializer_range": 0.02,
        },
        "text_config": {
            "model_type": "qwen3", "attention_bias": False, "attention_dropout": 0.0, "head_dim": 128,
            "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 8192,
            "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
            "rope_scaling": {"interleaved": True, "mrope_interleaved": True, "mrope_section": [24, 20, 20],
                             "rope_type": "default", "type": "default"},
            "rope_theta": 1000000, "tie_word_embeddings": False, "use_cache": True, "vocab_size": 152064,
            "initializer_range": 0.02,
        },
    },
    "transformers_version": "4.57.6",
}
_TINY_AUDIO: dict[str, Any] = {
    "d_model": 32, "downsample_hidden_size": 8, "encoder_attention_heads": 4, "encoder_ffn_dim": 64,
    "encoder_layers": 2, "num_hidden_layers": 2, "output_dim": 64,
}
_TINY_TEXT: dict[str, Any] = {
    "head_dim": 16, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "vocab_size": 4096,
    "rope_scaling": {"interleaved": True, "mrope_interleaved": True, "mrope_section": [4, 2, 2],
                     "rope_type": "default", "type": "default"},
}
_REAL_SPECIAL_BASE = 151643
# The tiny vocabulary keeps the published special block, moved down to this id (as the tiny TTS model's does).
_TINY_SPECIAL_BASE = 3840

# The Qwen3-ASR tokenizer's added tokens in id order from <|endoftext|>, and whether each is marked special.
_SPECIAL_BLOCK: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False), ("<|audio_start|>", True), ("<|audio_end|>", True),
    ("<tts_pad>", True), ("<tts_text_bos>", True), ("<tts_text_eod>", True), ("<tts_text_bos_single>", True),
    ("<non_speech>", False), ("<|audio_pad|>", True),
    *((f"<blank{number}>", True) for number in range(1, 28)),
    ("<asr_text>", False), ("<timestamp>", False),
)
# What Qwen3ASRProcessor reads off the tokenizer (`tokenizer.audio_token`, ...), as the published config names it.
_PROCESSOR_TOKENS = {
    "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>", "audio_token": "<|audio_pad|>",
    "image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
}
_PREPROCESSOR: dict[str, Any] = {
    "chunk_length": 30, "dither": 0.0, "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128,
    "hop_length": 160, "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
    "padding_value": 0.0, "processor_class": "Qwen3ASRProcessor", "return_attention_mask": True,
    "sampling_rate": SAMPLE_RATE,
}
_GENERATION = {"_from_model_config": True, "eos_token_id": [151643, 151645], "pad_token_id": 151643,
               "do_sample": False}


def check_preset(preset: str) -> str:
    if preset not in PRESETS:
        raise ValueError(f"unknown random aligner preset {preset!r}: expected one of {PRESETS}")
    return preset


def special_base(preset: str) -> int:
    return _TINY_SPECIAL_BASE if preset == "tiny" else _REAL_SPECIAL_BASE


def aligner_config_dict(preset: str) -> dict[str, Any]:
    """`config.json` for a preset: the published one, or its miniature with the specials moved down."""
    config = copy.deepcopy(_REAL_CONFIG)
    if check_preset(preset) == "tiny":
        thinker = config["thinker_config"]
        thinker["audio_config"].update(_TINY_AUDIO)
        thinker["text_config"].update(copy.deepcopy(_TINY_TEXT))
        shift = _TINY_SPECIAL_BASE - _REAL_SPECIAL_BASE
        for key in ("audio_start_token_id", "audio_end_token_id", "audio_token_id"):
            thinker[key] += shift
        config["timestamp_token_id"] += shift
    return config


def generation_config_dict(preset: str) -> dict[str, Any]:
    base = special_base(preset)
    return {**_GENERATION, "eos_token_id": [base, base + 2], "pad_token_id": base}


def write_aligner_tokenizer(directory: Path, preset: str, vocab_size: int) -> None:
    """The text tokenizer's files, with the Qwen3-ASR special block at the preset's ids."""
    base = special_base(preset)
    write_text_tokenizer(directory, {content: base + offset for offset, (content, _) in enumerate(_SPECIAL_BLOCK)},
                         vocab_size)
    # The shared writer marks every added token special and knows nothing of the processor's audio tokens.
    path = directory / CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8"))
    flags = dict(_SPECIAL_BLOCK)
    for entry in config["added_tokens_decoder"].values():
        entry["special"] = flags[entry["content"]]
    config["additional_special_tokens"] = [content for content, special in _SPECIAL_BLOCK
                                           if special and content != "<|endoftext|>"]
    config.update(_PROCESSOR_TOKENS, extra_special_tokens=dict(_PROCESSOR_TOKENS), processor_class="Qwen3ASRProcessor")
    write_json(path, config)


def weight_std(config: AlignerConfig) -> float:
    """Larger than the TTS model's 0.02: there every `<timestamp>` token, alike in embedding and barely moved by
    attention, gets the same class; at 4 / sqrt(width) the classes differ from word to word and fall out of order,
    as the repair step needs to be exercised (0.5 for the tiny preset, 0.125 at the published width)."""
    return 4.0 / math.sqrt(config.text.hidden_size)


def random_model(config: AlignerConfig, device: torch.device, seed: int) -> AlignerModel:
    """A model of `config`'s shapes with random weights drawn from `seed`."""
    model = build_model(config, device)
    randomize_(model, torch.Generator(device=device).manual_seed(seed), weight_std(config))
    return model


def write_random_aligner(directory: Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write a complete aligner checkpoint directory in the published layout."""
    raw_config = aligner_config_dict(preset)
    config = AlignerConfig.parse(raw_config)
    model = random_model(config, torch.device("cpu"), seed)
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / ALIGNER_CONFIG_FILE, raw_config)
    write_json(directory / "generation_config.json", generation_config_dict(preset))
    write_json(directory / PREPROCESSOR_CONFIG_FILE, _PREPROCESSOR)
    write_aligner_tokenizer(directory, preset, config.text.vocab_size)
    weights = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    save_file(weights, directory / WEIGHTS_FILE, metadata={"format": "pt"})
    return directory


def build_random_aligner(preset: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LoadedAligner:
    """The aligner `write_random_aligner` writes, built in memory on `device` (equal values only on the CPU)."""
    raw_config = aligner_config_dict(preset)
    config = AlignerConfig.parse(raw_config)
    model = random_model(config, device, seed)
    with tempfile.TemporaryDirectory() as scratch:
        # config.json beside the tokenizer: its transformers_version decides the pre-tokenizer, as on disk.
        write_json(Path(scratch) / ALIGNER_CONFIG_FILE, raw_config)
        write_aligner_tokenizer(Path(scratch), preset, config.text.vocab_size)
        tokenizer = load_text_tokenizer(Path(scratch))
    feature_extractor = feature_extractor_from(_PREPROCESSOR, config)
    return finish_loading(f"random:{preset}", config, model, tokenizer, feature_extractor, dtype, is_random=True)


def main(argv: list[str] | None = None) -> int:
    return writer_command(argv, "Qwen3-ForcedAligner", f"one of {', '.join(PRESETS)}", write_random_aligner)


if __name__ == "__main__":
    raise SystemExit(main())
