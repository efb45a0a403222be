"""A value of the wrong type in a checkpoint's JSON files fails loading with an error naming the file and the key.

Before the configs were read with their types checked, nearly every case here was a raw TypeError,
AttributeError or KeyError from deep inside loading, or an error that named neither file nor key.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from tts_service.model.checkpoint import CheckpointError, LoadOptions
from tts_service.model.configs import ConfigError
from tts_service.model.loading import load_model

CPU = LoadOptions(device=torch.device("cpu"), dtype=torch.float32)
MODEL = "config.json"
SPEECH = "speech_tokenizer/config.json"


class Case(NamedTuple):
    kind: str
    file: str
    keys: tuple[str, ...]
    value: object
    named: str  # what the error must name besides the file

    @property
    def id(self) -> str:
        return f"{self.file}:{'.'.join(self.keys)}={json.dumps(self.value)}"


def case(file: str, dotted: str, value: object, kind: str = "custom_voice", named: str | None = None) -> Case:
    return Case(kind, file, tuple(dotted.split(".")), value, named or dotted)


CASES = [
    case(MODEL, "tts_model_type", 3),
    case(MODEL, "tts_model_size", 0.6),
    case(MODEL, "tokenizer_type", ["qwen3_tts_tokenizer_12hz"]),
    case(MODEL, "im_start_token_id", True),
    case(MODEL, "transformers_version", 4.57),
    case(MODEL, "talker_config", "talker"),
    case(MODEL, "talker_config.hidden_size", "64"),
    case(MODEL, "talker_config.num_code_groups", 16.0),
    case(MODEL, "talker_config.text_vocab_size", [4096]),
    case(MODEL, "talker_config.rms_norm_eps", "1e-6"),
    case(MODEL, "talker_config.hidden_act", 1),
    case(MODEL, "talker_config.attention_bias", "false"),
    case(MODEL, "talker_config.codec_bos_id", None),
    case(MODEL, "talker_config.code_predictor_config", [1]),
    case(MODEL, "talker_config.code_predictor_config.num_attention_heads", 2.0),
    case(MODEL, "talker_config.rope_scaling", [6, 5, 5]),
    case(MODEL, "talker_config.rope_scaling.mrope_section", ["6", "5", "5"]),
    case(MODEL, "talker_config.rope_scaling.interleaved", "true"),
    case(MODEL, "talker_config.spk_id", ["ryan"]),
    case(MODEL, "talker_config.spk_id.ryan", "3061"),
    case(MODEL, "talker_config.spk_is_dialect.eric", ["sichuan_dialect"]),
    case(MODEL, "talker_config.codec_language_id.english", 2050.0),
    case(MODEL, "speaker_encoder_config", 64, kind="base"),
    case(MODEL, "speaker_encoder_config.enc_dim", "64", kind="base"),
    case(MODEL, "speaker_encoder_config.enc_channels", [64, 64, 64, 64, "192"], kind="base"),
    case(SPEECH, "encoder_valid_num_quantizers", "16"),
    case(SPEECH, "decoder_config", 7),
    case(SPEECH, "decoder_config.upsample_rates", "8543"),
    case(SPEECH, "decoder_config.rms_norm_eps", [1e-5]),
    case(SPEECH, "encoder_config", [], kind="base"),
    case(SPEECH, "encoder_config.hidden_size", "32", kind="base"),
    case(SPEECH, "encoder_config.use_causal_conv", 1, kind="base"),
    case(SPEECH, "encoder_config.upsampling_ratios", [8, "6", 5, 4], kind="base"),
    case(SPEECH, "encoder_config.rope_theta", "10000", kind="base"),
    # transformers 4.x keeps the null and 5.x's own validation rejects it: both name the field.
    case(SPEECH, "encoder_config.num_filters", None, kind="base", named="num_filters"),
]


def set_key(raw: Any, keys: tuple[str, ...], value: object) -> None:
    for key in keys[:-1]:
        raw = raw[key]
    raw[keys[-1]] = value


def edited_checkpoint(tiny_checkpoints: dict[str, Path], tmp_path: Path, kind: str, file: str,
                      edit: Any) -> Path:
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoints[kind], checkpoint)
    path = checkpoint / file
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return checkpoint


@pytest.mark.parametrize("bad", CASES, ids=[bad.id for bad in CASES])
def test_a_wrong_type_is_a_config_error_naming_the_file_and_the_key(
        tiny_checkpoints: dict[str, Path], tmp_path: Path, bad: Case) -> None:
    def edit(raw: Any) -> Any:
        set_key(raw, bad.keys, bad.value)
        return raw

    checkpoint = edited_checkpoint(tiny_checkpoints, tmp_path, bad.kind, bad.file, edit)
    with pytest.raises(ConfigError, match=rf"{re.escape(bad.file)}: .*{re.escape(bad.named)}"):
        load_model(str(checkpoint), CPU)


@pytest.mark.parametrize("file", [MODEL, SPEECH, "generation_config.json"])
def test_a_json_file_that_is_not_an_object_is_a_checkpoint_error_naming_it(
        tiny_checkpoints: dict[str, Path], tmp_path: Path, file: str) -> None:
    checkpoint = edited_checkpoint(tiny_checkpoints, tmp_path, "custom_voice", file, lambda raw: [raw])
    with pytest.raises(CheckpointError, match=rf"{re.escape(file)}: expected a JSON object, got an array"):
        load_model(str(checkpoint), CPU)


def test_a_shard_index_without_a_weight_map_object_is_a_checkpoint_error_naming_it(
        tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoints["custom_voice"], checkpoint)
    (checkpoint / "model.safetensors").unlink()
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["model-1.safetensors"]}))
    with pytest.raises(CheckpointError, match=r"model\.safetensors\.index\.json: weight_map must be an object"):
        load_model(str(checkpoint), CPU)
