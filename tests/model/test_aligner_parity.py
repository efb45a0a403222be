"""Parity with the official forced aligner (qwen-asr 0.0.6, `Qwen3ForcedAligner`) on identical random weights.

Both sides load the same tiny checkpoint directory, written once by our random-aligner builder, on the CPU in
float32. Every stage is compared: the words each text is cut into, the audio resampling, the model's inputs (token
ids, mask, log-mel features), the logits, and the timestamps of every word, alone and in a padded batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.reference import import_aligner_reference
from tts_service.model.aligner import AlignmentItem, ForcedAligner, resample
from tts_service.model.aligner_config import AlignerConfig
from tts_service.model.aligner_model import build_model
from tts_service.model.aligner_random import aligner_config_dict, write_random_aligner
from tts_service.model.aligner_text import repair_order, split_words

pytestmark = pytest.mark.parity

SAMPLE_RATE = 24000  # the TTS model's output rate: the aligner resamples it as the reference does
# Logits of the same weights and inputs, computed in the same order: equal up to float32 noise (in practice bitwise).
LOGITS_ATOL = 1e-5


def sweep(seconds: float, sample_rate: int = SAMPLE_RATE, seed: int = 0) -> np.ndarray:
    """A sine sweep with noise, deterministic."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    return (0.4 * np.sin(2 * np.pi * 150 * t * (1 + 0.6 * t)) + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


ITEMS = {
    "english": AlignmentItem(sweep(3.3, seed=1), SAMPLE_RATE,
                             "Hello, world! This is a test of the forced aligner; it's short, isn't it?", "English"),
    "chinese": AlignmentItem(sweep(2.1, seed=2), SAMPLE_RATE, "甚至出现交易几乎停滞的情况。今天天气很好！", "Chinese"),
    "mixed": AlignmentItem(sweep(9.4, seed=3), SAMPLE_RATE,
                           "我今天用 iPhone 拍了 20 张照片, the U.S.A. team won again and again. 好的！", "Chinese"),
    "long_44k": AlignmentItem(sweep(11.0, 44100, seed=4), 44100,
                              "A longer clip, over ten seconds, at forty-four point one kilohertz, read slowly.",
                              "English"),
}
WORD_TEXTS = [
    *(item.text for item in ITEMS.values()),
    "Ça va? Très bien — 谢谢! 123abc 'quoted' e-mail U.S. café\u0301 नमस्ते",
    "  tabs\tand\nnewlines\u3000ideographic\u00a0space  ",
    "emoji 😀 and ＦＵＬＬＷＩＤＴＨ ｌｅｔｔｅｒｓ, 𠀋𠀌 (extension B) 豈 (compatibility)",
    "Привет, мир! Γειά σου κόσμε. مرحبا بالعالم",
    "?!... —",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_aligner(tmp_path_factory.mktemp("aligner") / "tiny", "tiny", seed=3)


@pytest.fixture(scope="module")
def reference_module() -> Any:
    return import_aligner_reference()


@pytest.fixture(scope="module")
def reference(reference_module: Any, checkpoint: Path) -> Any:
    return reference_module.Qwen3ForcedAligner.from_pretrained(str(checkpoint), dtype=torch.float32)


@pytest.fixture(scope="module")
def ours(checkpoint: Path) -> ForcedAligner:
    return ForcedAligner.load(str(checkpoint), "cpu", torch.float32)


def reference_inputs(reference: Any, items: list[AlignmentItem]) -> Any:
    """What `Qwen3ForcedAligner.align` hands its model for `items`."""
    from qwen_asr.inference.utils import normalize_audios

    texts = [reference.aligner_processor.encode_timestamp(item.text, item.language or "English")[1] for item in items]
    audios = normalize_audios([(item.audio, item.sample_rate) for item in items])
    return reference.processor(text=texts, audio=audios, return_tensors="pt", padding=True)


def reference_times(reference: Any, items: list[AlignmentItem]) -> list[list[tuple[float, float]]]:
    results = reference.align(audio=[(item.audio, item.sample_rate) for item in items],
                              text=[item.text for item in items],
                              language=[item.language or "English" for item in items])
    return [[(entry.start_time, entry.end_time) for entry in result] for result in results]


@pytest.mark.parametrize("text", WORD_TEXTS)
def test_words_are_the_references(reference: Any, text: str) -> None:
    expected, _ = reference.aligner_processor.encode_timestamp(text, "English")
    assert [word.text for word in split_words(text)] == expected


def test_the_order_repair_is_the_references(reference: Any) -> None:
    rng = np.random.default_rng(0)
    for trial in range(300):
        size = int(rng.integers(1, 60))
        rising = np.sort(rng.integers(0, 400, size=size))
        # Mostly in order, with strays of every kind: single, paired, long runs, at either end.
        strays = rng.random(size) < rng.choice([0.05, 0.2, 0.5])
        values = np.where(strays, rng.integers(0, 400, size=size), rising) * np.float32(80)
        if trial % 7 == 0:
            values = np.round(values * 1.37, 2).astype(np.float32)  # interpolation between values of any size
        expected = reference.aligner_processor.fix_timestamp(values.astype(np.float32))
        assert repair_order(values.astype(np.float32).tolist()) == expected


@pytest.mark.parametrize("rate", [8000, 22050, 24000, 44100, 48000])
def test_resampling_is_librosas(rate: int) -> None:
    librosa = pytest.importorskip("librosa")
    clip = sweep(1.3, rate)
    np.testing.assert_array_equal(resample(clip, rate, 16000), librosa.resample(clip, orig_sr=rate, target_sr=16000))


@pytest.mark.parametrize("names", [("english",), ("chinese",), ("mixed",), ("english", "chinese", "mixed", "long_44k")],
                         ids=["english", "chinese", "mixed", "batch_of_four"])
def test_inputs_logits_and_timestamps_are_the_references(ours: ForcedAligner, reference: Any,
                                                         names: tuple[str, ...]) -> None:
    items = [ITEMS[name] for name in names]
    inputs = ours.prepare(items)
    expected = reference_inputs(reference, items)
    assert torch.equal(inputs.input_ids, expected["input_ids"])
    assert torch.equal(inputs.attention_mask, expected["attention_mask"].long())
    for row, features in enumerate(inputs.features):
        frames = int(expected["feature_attention_mask"][row].sum())
        assert torch.equal(features, expected["input_features"][row, :, :frames])

    with torch.inference_mode():
        reference_logits = reference.model.thinker(**expected).logits
    logits = ours.logits(inputs)
    real = inputs.attention_mask.bool()  # padding rows are never read
    torch.testing.assert_close(logits[real], reference_logits[real], rtol=0.0, atol=LOGITS_ATOL)
    stamps = inputs.input_ids == ours.tokens.timestamp
    assert torch.equal(logits.argmax(-1)[stamps], reference_logits.argmax(-1)[stamps])

    ours_times = [[(timing.start_s, timing.end_s) for timing in timings]
                  for timings in ours.align_many(items, clamp_to_audio=False)]
    assert ours_times == reference_times(reference, items)
    assert sum(len(times) for times in ours_times) == sum(len(split_words(item.text)) for item in items)


def test_timestamps_vary_enough_to_prove_something(ours: ForcedAligner) -> None:
    """Random weights that predicted one class everywhere would make the comparisons above vacuous."""
    times = [value for timings in ours.align_many(list(ITEMS.values()), clamp_to_audio=False)
             for timing in timings for value in (timing.start_s, timing.end_s)]
    assert len(set(times)) >= 5


@pytest.mark.parametrize("preset", ["tiny", "0.6b"])
def test_the_checkpoint_layout_is_the_references(reference_module: Any, preset: str) -> None:
    """Every tensor name and shape of the published layout, at the real size too (built on the meta device)."""
    from qwen_asr.core.transformers_backend import Qwen3ASRConfig, Qwen3ASRForConditionalGeneration

    raw = aligner_config_dict(preset)
    with torch.device("meta"):
        expected = Qwen3ASRForConditionalGeneration(Qwen3ASRConfig(**raw)).state_dict()
    built = build_model(AlignerConfig.parse(raw), torch.device("meta")).state_dict()
    assert {name: tuple(tensor.shape) for name, tensor in built.items()} == \
        {name: tuple(tensor.shape) for name, tensor in expected.items()}
