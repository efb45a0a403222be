from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.reference import import_reference
from tts_service.model.checkpoint import CheckpointError, LoadOptions, resolve_source
from tts_service.model.loading import load_model
from tts_service.model.random_checkpoint import build_random_model, parse_preset

CPU = LoadOptions(device=torch.device("cpu"), dtype=torch.float32)


def copy_checkpoint(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "vocab.json",
                                     "speech_tokenizer/model.safetensors", "speech_tokenizer/config.json"])
def test_missing_file_is_named(missing: str, tiny_checkpoints, tmp_path: Path) -> None:
    checkpoint = copy_checkpoint(tiny_checkpoints["custom_voice"], tmp_path / "ckpt")
    (checkpoint / missing).unlink()
    with pytest.raises(CheckpointError, match=missing.replace(".", r"\.")):
        load_model(str(checkpoint), CPU)


def rewrite_weights(checkpoint: Path, edit) -> None:
    path = checkpoint / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_missing_tensor_is_named(tiny_checkpoints, tmp_path: Path) -> None:
    checkpoint = copy_checkpoint(tiny_checkpoints["custom_voice"], tmp_path / "ckpt")
    rewrite_weights(checkpoint, lambda t: t.pop("talker.model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensors: model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(str(checkpoint), CPU)


def test_unexpected_tensor_is_named(tiny_checkpoints, tmp_path: Path) -> None:
    checkpoint = copy_checkpoint(tiny_checkpoints["custom_voice"], tmp_path / "ckpt")
    rewrite_weights(checkpoint, lambda t: t.update({"talker.model.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensors: model\.extra\.weight"):
        load_model(str(checkpoint), CPU)


def test_misshaped_tensor_is_named(tiny_checkpoints, tmp_path: Path) -> None:
    checkpoint = copy_checkpoint(tiny_checkpoints["custom_voice"], tmp_path / "ckpt")
    rewrite_weights(checkpoint, lambda t: t.update({"talker.codec_head.weight": torch.zeros(3, 3)}))
    with pytest.raises(CheckpointError, match=r"mis-shaped tensors: codec_head\.weight \(3, 3\)"):
        load_model(str(checkpoint), CPU)


def test_corrupt_weights_file_fails_clearly(tiny_checkpoints, tmp_path: Path) -> None:
    checkpoint = copy_checkpoint(tiny_checkpoints["custom_voice"], tmp_path / "ckpt")
    (checkpoint / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="cannot read weights"):
        load_model(str(checkpoint), CPU)


def test_unknown_model_type_in_config_fails_clearly(tiny_checkpoints, tmp_path: Path) -> None:
    checkpoint = copy_checkpoint(tiny_checkpoints["custom_voice"], tmp_path / "ckpt")
    config = json.loads((checkpoint / "config.json").read_text())
    config["tts_model_type"] = "singing"
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="tts_model_type"):
        load_model(str(checkpoint), CPU)


def test_offline_repo_id_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CheckpointError, match=r"huggingface-cli download .* --model DIR"):
        resolve_source("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", cache_dir=str(tmp_path))


def test_source_that_is_neither_directory_nor_repo_id_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="neither a checkpoint directory"):
        resolve_source(str(tmp_path / "does" / "not" / "exist"))


def test_unknown_random_preset_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown random preset"):
        parse_preset("3b-custom_voice")


def test_in_memory_random_model_matches_written_checkpoint_on_cpu(tiny_checkpoints) -> None:
    written = load_model(str(tiny_checkpoints["base"]), CPU)
    built = build_random_model("tiny-base", CPU, seed=2)  # conftest writes base with seed 2
    for name, tensor in written.talker.state_dict().items():
        assert torch.equal(tensor, built.talker.state_dict()[name]), name
    assert built.is_random and not written.is_random


@pytest.mark.parity
@pytest.mark.parametrize("model_type", ["custom_voice", "base"])
def test_checkpoint_saved_by_reference_loads_without_missing_or_unexpected_tensors(
        model_type: str, tiny_checkpoints, tmp_path: Path) -> None:
    import_reference()
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    source = tiny_checkpoints[model_type]
    target = tmp_path / "saved_by_reference"
    config = json.loads((source / "config.json").read_text())
    Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**config)).save_pretrained(target)
    speech = json.loads((source / "speech_tokenizer/config.json").read_text())
    Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**speech)).save_pretrained(target / "speech_tokenizer")
    for name in ("generation_config.json", "vocab.json", "merges.txt", "tokenizer_config.json",
                 "speech_tokenizer/preprocessor_config.json"):
        shutil.copy(source / name, target / name)

    loaded = load_model(str(target), CPU)
    reference_talker = load_file(target / "model.safetensors")
    assert torch.equal(loaded.talker.codec_head.weight, reference_talker["talker.codec_head.weight"])
    assert (loaded.speaker_encoder is not None) == (model_type == "base")


@pytest.mark.parametrize(("device", "codec_dtype", "convolution_dtype", "is_half"), [
    ("cuda", "float32", "auto", True),
    ("cpu", "float32", "auto", False),
    ("cuda", "bfloat16", "auto", False),
    ("cuda", "float32", "float32", False),
    ("cpu", "float32", "float16", True),
])
def test_auto_codec_convolutions_are_fp16_for_an_fp32_codec_on_cuda_alone(device: str, codec_dtype: str,
                                                                          convolution_dtype: str,
                                                                          is_half: bool) -> None:
    options = LoadOptions.default_for(device, codec_dtype, convolution_dtype)
    assert options.codec_half_convolutions is is_half
