"""Random-weight Qwen3-TTS checkpoints at the real shapes (or tiny ones for CPU tests).

Real weights cannot be downloaded everywhere; random weights at the published shapes are how
speed is measured, and identical random weights loaded by both this service and the reference
package are how fidelity is proven. A preset is `<size>-<model type>`: size `tiny`, `0.6b` or
`1.7b`; type `custom_voice`, `voice_design` or `base`. The same builder writes a checkpoint
directory in the published layout or builds the model in memory (`random:1.7b-base`), in both cases with the
loader's public steps (`checkpoint.build_modules`, `checkpoint.finish_loading`).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from tts_service.model.checkpoint import (
    LoadedModel,
    LoadOptions,
    ModelModules,
    build_modules,
    finish_loading,
    needs_codec_encoder,
)
from tts_service.model.configs import MODEL_TYPES, ModelConfig, SpeechTokenizerConfig
from tts_service.model.text_tokenizer import load_text_tokenizer, write_text_tokenizer

SIZES = ("tiny", "0.6b", "1.7b")
WEIGHT_STD = 0.02

_REAL_TALKER: dict[str, Any] = {
    "code_predictor_config": {
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
        "max_position_embeddings": 65536, "num_attention_heads": 16, "num_code_groups": 16,
        "num_hidden_layers": 5, "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
        "vocab_size": 2048, "layer_types": ["full_attention"] * 5, "use_sliding_window": False,
        "sliding_window": None, "attention_bias": False, "model_type": "qwen3_tts_talker_code_predictor",
    },
    "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_think_id": 2154, "codec_nothink_id": 2155,
    "codec_pad_id": 2148, "codec_think_bos_id": 2156, "codec_think_eos_id": 2157,
    "codec_language_id": {
        "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
        "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
        "beijing_dialect": 2074, "sichuan_dialect": 2062,
    },
    "spk_id": {
        "serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
        "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878,
    },
    "spk_is_dialect": {
        "serena": False, "vivian": False, "uncle_fu": False, "ryan": False, "aiden": False,
        "ono_anna": False, "sohee": False, "eric": "sichuan_dialect", "dylan": "beijing_dialect",
    },
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
    "max_position_embeddings": 32768, "model_type": "qwen3_tts_talker", "num_attention_heads": 16,
    "num_code_groups": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "position_id_per_seconds": 13,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default", "type": "default"},
    "rope_theta": 1000000, "sliding_window": None, "use_sliding_window": False, "attention_bias": False,
    "text_hidden_size": 2048, "text_vocab_size": 151936, "vocab_size": 3072,
}

# The tiny model keeps the real codec ids and vocabularies' meaning but shrinks every width.
_TINY_TALKER_OVERRIDES: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "text_hidden_size": 48, "text_vocab_size": 4096,
    "rope_scaling": {"interleaved": True, "mrope_section": [6, 5, 5], "rope_type": "default", "type": "default"},
}
_TINY_PREDICTOR_OVERRIDES: dict[str, Any] = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 16, "layer_types": ["full_attention"] * 2,
}
_REAL_TEXT_SPECIALS = {"endoftext": 151643, "im_start": 151644, "im_end": 151645,
                       "tts_pad": 151671, "tts_bos": 151672, "tts_eos": 151673}
_TINY_SPECIAL_BASE = 3840

_REAL_SPEECH_TOKENIZER: dict[str, Any] = {
    "architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": "qwen3_tts_tokenizer_12hz",
    "encoder_valid_num_quantizers": 16, "input_sample_rate": 24000, "output_sample_rate": 24000,
    "decode_upsample_rate": 1920, "encode_downsample_rate": 1920,
    "decoder_config": {
        "attention_bias": False, "latent_dim": 1024, "codebook_dim": 512, "codebook_size": 2048,
        "decoder_dim": 1536, "hidden_act": "silu", "hidden_size": 512, "intermediate_size": 1024,
        "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000, "head_dim": 64,
        "num_attention_heads": 16, "num_hidden_layers": 8, "num_key_value_heads": 16, "num_quantizers": 16,
        "num_semantic_quantizers": 1, "rms_norm_eps": 1e-05, "rope_theta": 10000, "semantic_codebook_size": 4096,
        "sliding_window": 72, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2],
        "vector_quantization_hidden_dimension": 512,
    },
}
_TINY_DECODER_OVERRIDES: dict[str, Any] = {
    "latent_dim": 64, "codebook_dim": 32, "decoder_dim": 96, "hidden_size": 64, "intermediate_size": 128,
    "head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
    "vector_quantization_hidden_dimension": 32,
}
_TINY_MIMI: dict[str, Any] = {
    "hidden_size": 32, "num_filters": 4, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8, "codebook_dim": 16,
    "vector_quantization_hidden_dimension": 16, "upsample_groups": 32, "num_quantizers": 16,
}
_PREPROCESSOR = {
    "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "padding_side": "right",
    "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 24000,
    "chunk_length_s": None, "overlap": None,
}
_GENERATION = {
    "do_sample": True, "temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05,
    "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
    "max_new_tokens": 8192,
}


def parse_preset(preset: str) -> tuple[str, str]:
    size, _, model_type = preset.partition("-")
    if size not in SIZES or model_type not in MODEL_TYPES:
        raise ValueError(f"unknown random preset {preset!r}: expected <size>-<type> with size in {SIZES} "
                         f"and type in {MODEL_TYPES}, e.g. 'tiny-custom_voice' or '1.7b-base'")
    return size, model_type


def text_special_ids(size: str) -> dict[str, int]:
    if size != "tiny":
        return dict(_REAL_TEXT_SPECIALS)
    first = _REAL_TEXT_SPECIALS["endoftext"]
    return {name: _TINY_SPECIAL_BASE + token - first for name, token in _REAL_TEXT_SPECIALS.items()}


def model_config_dict(size: str, model_type: str) -> dict[str, Any]:
    talker = copy.deepcopy(_REAL_TALKER)
    if size == "0.6b":
        talker.update(hidden_size=1024, intermediate_size=3072)
    elif size == "tiny":
        talker.update(copy.deepcopy(_TINY_TALKER_OVERRIDES))
        talker["code_predictor_config"].update(_TINY_PREDICTOR_OVERRIDES)
    if model_type != "custom_voice":
        talker["spk_id"], talker["spk_is_dialect"] = {}, {}
    specials = text_special_ids(size)
    config: dict[str, Any] = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": "0b6" if size == "0.6b" else "1b7",  # tiny is a miniature 1.7B
        "tts_model_type": model_type,
        "assistant_token_id": 77091,
        "im_start_token_id": specials["im_start"],
        "im_end_token_id": specials["im_end"],
        "tts_pad_token_id": specials["tts_pad"],
        "tts_bos_token_id": specials["tts_bos"],
        "tts_eos_token_id": specials["tts_eos"],
        "talker_config": talker,
    }
    if model_type == "base":
        encoder: dict[str, Any] = {"enc_dim": talker["hidden_size"]}
        if size == "tiny":
            encoder.update(enc_channels=[32, 32, 32, 32, 96], enc_attention_channels=16, enc_se_channels=16)
        config["speaker_encoder_config"] = encoder
    return config


def speech_tokenizer_config_dict(size: str) -> dict[str, Any]:
    config = copy.deepcopy(_REAL_SPEECH_TOKENIZER)
    if size == "tiny":
        config["decoder_config"].update(_TINY_DECODER_OVERRIDES)
        config["encoder_config"] = dict(_TINY_MIMI)
    return config


def randomize_(module: nn.Module, generator: torch.Generator, std: float = WEIGHT_STD) -> None:
    """Random weights: normal matrices and embeddings, small biases, norm scales near one.

    Submodules that know their own parametrisation (codebooks, Snake activations, layer scales)
    provide `randomize_` and are left to it.
    """
    own = getattr(module, "randomize_", None)
    if callable(own):
        own(generator, std)
        return
    for name, parameter in module.named_parameters(recurse=False):
        with torch.no_grad():
            if name == "bias":
                parameter.normal_(0.0, std, generator=generator)
            elif parameter.dim() == 1:
                parameter.normal_(1.0, 0.1, generator=generator)
            else:
                parameter.normal_(0.0, std, generator=generator)
    for child in module.children():
        randomize_(child, generator, std)


def random_modules(config: ModelConfig, speech_config: SpeechTokenizerConfig, device: torch.device,
                   seed: int, with_codec_encoder: bool = True) -> ModelModules:
    """Modules of the shapes `config` and `speech_config` give, with random weights drawn from `seed`."""
    modules = build_modules(config, speech_config, device, with_codec_encoder)
    generator = torch.Generator(device=device).manual_seed(seed)
    for module in (modules.talker, modules.speaker_encoder, modules.codec_decoder, modules.codec_encoder):
        if module is not None:
            randomize_(module, generator)
    return modules


def write_random_checkpoint(directory: Path, preset: str, seed: int = 0) -> Path:
    """Write a complete checkpoint directory in the published layout."""
    size, model_type = parse_preset(preset)
    raw_config = model_config_dict(size, model_type)
    raw_speech = speech_tokenizer_config_dict(size)
    config = ModelConfig.parse(raw_config)
    speech_config = SpeechTokenizerConfig.parse(raw_speech)
    # Every published checkpoint ships the speech-tokenizer encoder, whatever its model type.
    modules = random_modules(config, speech_config, torch.device("cpu"), seed, with_codec_encoder=True)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "speech_tokenizer").mkdir(exist_ok=True)
    write_json(directory / "config.json", raw_config)
    write_json(directory / "generation_config.json", _GENERATION)
    write_json(directory / "speech_tokenizer/config.json", raw_speech)
    write_json(directory / "speech_tokenizer/preprocessor_config.json", _PREPROCESSOR)
    write_text_tokenizer(directory, text_special_ids(size), config.talker.text_vocab_size)

    weights = {f"talker.{k}": v for k, v in modules.talker.state_dict().items()}
    if modules.speaker_encoder is not None:
        weights |= {f"speaker_encoder.{k}": v for k, v in modules.speaker_encoder.state_dict().items()}
    save_file(_contiguous(weights), directory / "model.safetensors", metadata={"format": "pt"})
    assert modules.codec_encoder is not None
    codec = {f"decoder.{k}": v for k, v in modules.codec_decoder.state_dict().items()}
    codec |= {f"encoder.{k}": v for k, v in modules.codec_encoder.state_dict().items()}
    save_file(_contiguous(codec), directory / "speech_tokenizer/model.safetensors", metadata={"format": "pt"})
    return directory


def build_random_model(preset: str, options: LoadOptions, seed: int = 0) -> LoadedModel:
    """A model of the same shapes as `write_random_checkpoint` writes, built in memory on the target device.

    Values match a written checkpoint of the same seed only when built on the CPU.
    """
    size, model_type = parse_preset(preset)
    config = ModelConfig.parse(model_config_dict(size, model_type))
    speech_config = SpeechTokenizerConfig.parse(speech_tokenizer_config_dict(size))
    modules = random_modules(config, speech_config, options.device, seed, needs_codec_encoder(config, options))
    with tempfile.TemporaryDirectory() as scratch:
        write_text_tokenizer(Path(scratch), text_special_ids(size), config.talker.text_vocab_size)
        tokenizer = load_text_tokenizer(Path(scratch))
    return finish_loading(f"random:{preset}", config, speech_config, dict(_GENERATION), modules, tokenizer,
                          options, is_random=True)


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().contiguous() for name, tensor in tensors.items()}


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def writer_command(argv: list[str] | None, what: str, preset_help: str,
                   write: Callable[[Path, str, int], object]) -> int:
    """The command line of a random-checkpoint writer: a preset, a directory, a seed."""
    parser = argparse.ArgumentParser(description=f"Write a random-weight {what} checkpoint directory.")
    parser.add_argument("preset", help=preset_help)
    parser.add_argument("output", type=Path, help="directory to write")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        write(args.output, args.preset, args.seed)
    except ValueError as error:
        parser.error(str(error))
    sys.stdout.write(f"wrote random-weight {what} {args.preset} to {args.output}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    return writer_command(argv, "Qwen3-TTS", "<size>-<type>, size in tiny/0.6b/1.7b, type in "
                                             "custom_voice/voice_design/base", write_random_checkpoint)


if __name__ == "__main__":
    raise SystemExit(main())
