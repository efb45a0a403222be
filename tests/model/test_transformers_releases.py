"""What transformers changed between the reference's release (4.57.3) and 5.x, held to the reference on every one.

The parity tests prove equality with qwen-tts, which pins transformers 4.57.3; the tests here without the
parity mark prove that the same behaviour holds on whichever release is installed, so the parity proven on
4.57.3 carries over. CI runs them again in a venv with the newest release the project allows.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.model.test_codec_encoder import (
    TINY,
    TINY_RAW,
    random_encoder,
    reference_model_encode,
    reference_tokenizer_model,
)
from tests.reference import import_reference
from tests.signals import sweep_signal
from tts_service.model.codec_encoder import CodecEncoder
from tts_service.model.text_tokenizer import (
    CONFIG_FILE,
    MERGES_FILE,
    VOCAB_FILE,
    load_text_tokenizer,
    write_text_tokenizer,
)

SAMPLE_RATE = 24000
# Longer than Mimi's configured 250-frame attention window (10 s at the transformer's 25 Hz).
LONG_CLIP_SAMPLES = 16 * SAMPLE_RATE

# The published text tokenizer's size and special ids: over 100k tokens, where the Mistral split applies.
PUBLISHED_VOCAB = 151936
PUBLISHED_SPECIALS = {"endoftext": 151643, "im_start": 151644, "im_end": 151645,
                      "tts_pad": 151671, "tts_bos": 151672, "tts_eos": 151673}
# A checkpoint's config.json -> whether the reference's transformers swaps in the Mistral split.
SPLIT_RULE_CASES: dict[str, tuple[dict[str, Any] | None, bool]] = {
    "no_config": (None, False),
    "config_without_version": ({"model_type": "qwen3_tts"}, True),
    "saved_by_4.57.3": ({"model_type": "qwen3_tts", "transformers_version": "4.57.3"}, True),
    "saved_by_4.57.2": ({"model_type": "qwen3_tts", "transformers_version": "4.57.2"}, False),
    "saved_by_5.0.0": ({"model_type": "qwen3_tts", "transformers_version": "5.0.0"}, False),
}


# -- the codec encoder (transformers' Mimi) ------------------------------------------------------------


def test_codec_encoder_keys_are_the_flat_mimi_names_the_checkpoints_use() -> None:
    # transformers 5.x nests the encoding half under MimiModel.encoder; the published checkpoints do not.
    keys = set(CodecEncoder(TINY).state_dict())
    assert {"encoder.layers.0.conv.weight", "encoder_transformer.layers.0.self_attn.q_proj.weight",
            "downsample.conv.weight",
            "quantizer.semantic_residual_vector_quantizer.layers.0.codebook.embed_sum",
            "quantizer.acoustic_residual_vector_quantizer.input_proj.weight"} <= keys
    assert {key.split(".")[0] for key in keys} == {"encoder", "encoder_transformer", "downsample", "quantizer"}


def test_codec_encoder_attends_to_audio_further_back_than_mimis_sliding_window() -> None:
    # 4.57.3 masks Mimi's transformer causally without its 250-frame window; 5.x would cut the first two
    # seconds out of the last frame's view and leave its state bit for bit unchanged.
    encoder = random_encoder(TINY, seed=1)
    clip = sweep_signal(14 * SAMPLE_RATE)
    changed_start = clip.copy()
    changed_start[: 2 * SAMPLE_RATE] = sweep_signal(2 * SAMPLE_RATE, seed=9, base_hz=500.0)

    def last_frame_state(wav: np.ndarray) -> torch.Tensor:
        with torch.inference_mode():
            convolved = encoder.encoder(torch.from_numpy(wav)[None, None])
            return encoder.encoder_transformer(convolved.transpose(1, 2)).last_hidden_state[0, -1]

    assert (last_frame_state(clip) - last_frame_state(changed_start)).abs().max() > 1e-6


@pytest.mark.parity
def test_codes_of_a_clip_longer_than_mimis_window_equal_the_reference() -> None:
    import_reference()
    ours = random_encoder(TINY, seed=3)
    reference = reference_tokenizer_model(TINY_RAW, ours)
    wav = sweep_signal(LONG_CLIP_SAMPLES, seed=6)
    assert torch.equal(ours.encode(torch.from_numpy(wav)), reference_model_encode(reference, wav))


# -- the text tokenizer's pre-tokenizer split ----------------------------------------------------------


@pytest.fixture(scope="module")
def published_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("published_tokenizer")
    write_text_tokenizer(directory, PUBLISHED_SPECIALS, PUBLISHED_VOCAB)
    return directory


def checkpoint_with_config(published_tokenizer: Path, target: Path, config: dict[str, Any] | None) -> Path:
    target.mkdir()
    for name in (VOCAB_FILE, MERGES_FILE, CONFIG_FILE):
        shutil.copy(published_tokenizer / name, target / name)
    if config is not None:
        (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("case", sorted(SPLIT_RULE_CASES))
def test_the_reference_releases_rule_decides_the_split_on_every_release(published_tokenizer: Path, tmp_path: Path,
                                                                        case: str) -> None:
    config, swaps = SPLIT_RULE_CASES[case]
    tokenizer = load_text_tokenizer(checkpoint_with_config(published_tokenizer, tmp_path / "ckpt", config))
    pieces = [piece for piece, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str("HelloWorld")]
    assert pieces == (["Hello", "World"] if swaps else ["HelloWorld"])


@pytest.mark.parity
@pytest.mark.parametrize("case", sorted(SPLIT_RULE_CASES))
def test_text_ids_equal_the_reference_processors(published_tokenizer: Path, tmp_path: Path, case: str) -> None:
    import_reference()
    from qwen_tts.core.models import Qwen3TTSProcessor

    directory = checkpoint_with_config(published_tokenizer, tmp_path / "ckpt", SPLIT_RULE_CASES[case][0])
    processor = Qwen3TTSProcessor.from_pretrained(str(directory), fix_mistral_regex=True)
    tokenizer = load_text_tokenizer(directory)
    for text in ("HelloWorld, an iPhone on YouTube", "read/write DON'T you're", "Order #42 costs $3.50"):
        assert tokenizer.encode(text) == processor(text=text)["input_ids"][0], text
