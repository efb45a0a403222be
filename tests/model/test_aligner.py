"""The forced aligner on a tiny random checkpoint (CPU): its config errors name the key, its words map back to the
caller's text, and its timings run in order inside the audio. Parity with qwen-asr is test_aligner_parity.py's."""

from __future__ import annotations

import json
import re
import shutil
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tts_service.model.aligner import AlignmentItem, ForcedAligner, WordTiming, prepare_audio
from tts_service.model.aligner_config import AlignerConfig, audio_token_count
from tts_service.model.aligner_random import aligner_config_dict, write_random_aligner
from tts_service.model.aligner_text import UnsupportedLanguageError, is_cjk, num_cjk, repair_order, split_words
from tts_service.model.checkpoint import CheckpointError

SAMPLE_RATE = 24000


@pytest.fixture(scope="module")
def tiny_aligner_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_aligner(tmp_path_factory.mktemp("aligner") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="module")
def aligner(tiny_aligner_dir: Path) -> ForcedAligner:
    return ForcedAligner.load(str(tiny_aligner_dir), "cpu", torch.float32)


def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    """A gliding tone with noise: deterministic, and unlike silence for the features."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * 180 * t * (1 + 0.5 * t)) + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)


# -- config errors ----------------------------------------------------------------------------------------------


def set_key(raw: dict[str, Any], dotted: str, value: object) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        raw = raw[key]
    if value is _DELETE:
        del raw[last]
    else:
        raw[last] = value


_DELETE = object()
CONFIG_CASES = [
    ("timestamp_token_id", _DELETE, "timestamp_token_id"),
    ("timestamp_segment_time", "80", "timestamp_segment_time"),
    ("timestamp_segment_time", 0, "timestamp_segment_time"),
    ("model_type", "qwen3_tts", "model_type"),
    ("support_languages", "English", "support_languages"),
    ("thinker_config", [1], "thinker_config"),
    ("thinker_config.model_type", "qwen3_asr_thinker", "thinker_config.model_type"),
    ("thinker_config.classify_num", "5000", "thinker_config.classify_num"),
    ("thinker_config.classify_num", _DELETE, "thinker_config.classify_num"),
    ("thinker_config.audio_token_id", 10**6, "thinker_config.audio_token_id"),
    ("thinker_config.audio_config.n_window", 100, "thinker_config.audio_config.n_window"),
    ("thinker_config.audio_config.d_model", 30, "thinker_config.audio_config.d_model"),
    ("thinker_config.audio_config.activation_function", "relu", "thinker_config.audio_config.activation_function"),
    ("thinker_config.audio_config.output_dim", 48, "thinker_config.audio_config.output_dim"),
    ("thinker_config.text_config.hidden_act", "gelu", "thinker_config.text_config.hidden_act"),
    ("thinker_config.text_config.num_key_value_heads", 3, "thinker_config.text_config.num_attention_heads"),
    ("thinker_config.text_config.rope_scaling.rope_type", "yarn", "thinker_config.text_config.rope_scaling.rope_type"),
    ("thinker_config.text_config.hidden_size", 64.0, "thinker_config.text_config.hidden_size"),
]


@pytest.mark.parametrize(("dotted", "value", "named"), CONFIG_CASES, ids=[case[0] + "=" + repr(case[1])
                                                                         for case in CONFIG_CASES])
def test_a_bad_config_field_is_named(dotted: str, value: object, named: str) -> None:
    raw = aligner_config_dict("tiny")
    set_key(raw, dotted, value)
    with pytest.raises(ValueError, match=r"config\.json: .*" + re.escape(named)):
        AlignerConfig.parse(raw)


def broken_copy(source: Path, target: Path, file: str, change: Callable[[dict[str, Any]], None]) -> Path:
    shutil.copytree(source, target)
    raw = json.loads((target / file).read_text(encoding="utf-8"))
    change(raw)
    (target / file).write_text(json.dumps(raw), encoding="utf-8")
    return target


@pytest.mark.parametrize(("file", "change", "named"), [
    ("config.json", lambda raw: set_key(raw, "thinker_config.classify_num", -1), "thinker_config.classify_num"),
    ("preprocessor_config.json", lambda raw: set_key(raw, "feature_size", 80), "feature_size"),
    ("preprocessor_config.json", lambda raw: set_key(raw, "sampling_rate", 24000), "sampling_rate"),
    # An id inside the vocabulary, but not the one the tokenizer gives <timestamp>.
    ("config.json", lambda raw: set_key(raw, "timestamp_token_id", 3841), "timestamp_token_id"),
], ids=["classify_num", "feature_size", "sampling_rate", "timestamp_token_id_vs_tokenizer"])
def test_loading_a_bad_checkpoint_names_the_file_and_key(tiny_aligner_dir: Path, tmp_path: Path, file: str,
                                                         change: Callable[[dict[str, Any]], None], named: str) -> None:
    broken = broken_copy(tiny_aligner_dir, tmp_path / "broken", file, change)
    with pytest.raises(CheckpointError, match=re.escape(file) + ": .*" + re.escape(named)):
        ForcedAligner.load(str(broken), "cpu", torch.float32)


def test_missing_weights_are_named(tiny_aligner_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_aligner_dir, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=re.escape("model.safetensors")):
        ForcedAligner.load(str(broken), "cpu", torch.float32)


def test_random_source_builds_the_written_checkpoint(tiny_aligner_dir: Path, aligner: ForcedAligner) -> None:
    built = ForcedAligner.load("random:tiny", "cpu", torch.float32)
    assert built.is_random and not aligner.is_random
    written, in_memory = aligner.model.state_dict(), built.model.state_dict()
    assert written.keys() == in_memory.keys()
    assert all(torch.equal(written[name], in_memory[name]) for name in written)
    assert built.tokens == aligner.tokens


def test_audio_token_count_matches_the_encoder(aligner: ForcedAligner) -> None:
    for frames in (1, 7, 99, 100, 101, 250, 1234):
        features = torch.zeros(aligner.config.audio.num_mel_bins, frames)
        with torch.inference_mode():
            tokens = aligner.model.thinker.audio_tower(features)
        assert tokens.shape == (audio_token_count(frames), aligner.config.text.hidden_size)


# -- words and offsets -----------------------------------------------------------------------------------------


def spans(text: str, language: str | None = None) -> list[tuple[str, str]]:
    """(word as the model reads it, the caller's text it covers)."""
    return [(word.text, text[word.start_char:word.end_char]) for word in split_words(text, language)]


def test_english_words_drop_punctuation_and_keep_apostrophes() -> None:
    assert spans("Hello, world! Don't stop.") == [("Hello", "Hello"), ("world", "world"), ("Don't", "Don't"),
                                                 ("stop", "stop")]


def test_punctuation_inside_a_word_is_dropped_from_its_text_but_not_its_span() -> None:
    assert spans("The U.S.A. (e-mail) — ok?! ...") == [("The", "The"), ("USA", "U.S.A"), ("email", "e-mail"),
                                                       ("ok", "ok")]


# The reference's CJK ideograph ranges (qwen-asr 0.0.6), as it tests each code point.
REFERENCE_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
                        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF))


def test_every_code_point_is_cjk_exactly_when_a_reference_range_holds_it_and_a_text_counts_them() -> None:
    every = [chr(code) for code in range(0x110000) if not 0xD800 <= code <= 0xDFFF]
    cjk = [char for char in every if any(low <= ord(char) <= high for low, high in REFERENCE_CJK_RANGES)]
    assert [char for char in every if is_cjk(char)] == cjk
    assert num_cjk("".join(every)) == len(cjk)
    assert num_cjk("Hello, 世界 and 𠀀!") == 3


def test_every_chinese_character_is_a_word() -> None:
    text = "今天天气很好，我们去公园。"
    assert spans(text, "Chinese") == [(char, char) for char in "今天天气很好我们去公园"]
    assert [word.start_char for word in split_words(text)] == [0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11]


def test_mixed_text_splits_ideographs_from_latin_runs() -> None:
    assert spans("我用iPhone拍照, 2024年 OK") == [("我", "我"), ("用", "用"), ("iPhone", "iPhone"), ("拍", "拍"),
                                              ("照", "照"), ("2024", "2024"), ("年", "年"), ("OK", "OK")]


def test_repeated_words_keep_their_own_offsets() -> None:
    text = "the cat and the the hat, the end"
    words = split_words(text)
    the = [word.start_char for word in words if word.text == "the"]
    assert the == [0, 12, 16, 25]
    assert all(text[word.start_char:word.end_char] == word.text for word in words)


def test_combining_marks_stay_inside_the_span() -> None:
    text = "cafe\u0301 नमस्ते"
    words = split_words(text)
    assert [word.text for word in words] == ["cafe", "नमसत"]  # the reference drops marks from the words it times
    assert [text[word.start_char:word.end_char] for word in words] == ["cafe\u0301", "नमस्ते"]


def test_text_without_words_has_none() -> None:
    assert split_words(" ... !? — ") == []


@pytest.mark.parametrize("language", ["Japanese", "korean"])
def test_japanese_and_korean_are_refused(language: str) -> None:
    with pytest.raises(UnsupportedLanguageError, match=language):
        split_words("こんにちは", language)


# -- timings ---------------------------------------------------------------------------------------------------


TEXTS = {
    "english": ("Hello, world! This is a test of the forced aligner, and the test is short.", "English"),
    "chinese": ("今天天气很好，我们一起去公园散步吧。", "Chinese"),
    "mixed": ("我今天用 iPhone 拍了 20 张照片, don't you think? 好的！", None),
    "repeated": ("again and again and again, again!", "English"),
}


def check_timings(text: str, language: str | None, timings: list[WordTiming], duration_s: float) -> None:
    words = split_words(text, language)
    assert [(t.start_char, t.end_char) for t in timings] == [(w.start_char, w.end_char) for w in words]
    times = [value for timing in timings for value in (timing.start_s, timing.end_s)]
    assert times == sorted(times), "timings must not go backwards"
    assert all(0.0 <= value <= duration_s for value in times)


@pytest.mark.parametrize("name", TEXTS)
def test_timings_are_monotone_inside_the_audio_and_map_to_the_text(aligner: ForcedAligner, name: str) -> None:
    text, language = TEXTS[name]
    audio = speech_like(3.5)
    timings = aligner.align(audio, SAMPLE_RATE, text, language)
    check_timings(text, language, timings, len(audio) / SAMPLE_RATE)
    unclamped = aligner.align(audio, SAMPLE_RATE, text, language, clamp_to_audio=False)
    unclamped_times = [value for timing in unclamped for value in (timing.start_s, timing.end_s)]
    assert unclamped_times == sorted(unclamped_times)
    assert all(value <= aligner.config.max_time_s for value in unclamped_times)
    # The clamp only ever moves a time down to the end of the audio.
    assert [(t.start_s, t.end_s) for t in timings] == [(min(t.start_s, 3.5), min(t.end_s, 3.5)) for t in unclamped]


def test_a_batch_aligns_each_item_and_skips_texts_without_words(aligner: ForcedAligner) -> None:
    items = [AlignmentItem(speech_like(2.0, seed=1), SAMPLE_RATE, *TEXTS["english"]),
             AlignmentItem(speech_like(1.0, seed=2), 16000, "?!", None),
             AlignmentItem(speech_like(4.2, seed=3), 44100, *TEXTS["mixed"])]
    results = aligner.align_many(items)
    assert results[1] == []
    for item, timings in zip(items, results, strict=True):
        if timings:
            check_timings(item.text, item.language, timings, len(item.audio) / item.sample_rate)


def test_bfloat16_aligns_too(tiny_aligner_dir: Path) -> None:
    bf16 = ForcedAligner.load(str(tiny_aligner_dir), "cpu", torch.bfloat16)
    text, language = TEXTS["mixed"]
    check_timings(text, language, bf16.align(speech_like(2.0), SAMPLE_RATE, text, language), 2.0)


def test_repair_keeps_the_longest_rising_run_and_fills_the_rest() -> None:
    assert repair_order([]) == []
    assert repair_order([80.0, 160.0, 240.0]) == [80, 160, 240]
    assert repair_order([80.0, 4000.0, 160.0, 240.0]) == [80, 80, 160, 240]  # one stray value: its nearer neighbour
    assert repair_order([400.0, 80.0, 160.0]) == [80, 80, 160]  # no left neighbour: the right one
    # Three strays between 240 and 720: evenly spaced between them.
    assert repair_order([80.0, 240.0, 5000.0, 0.0, 3000.0, 720.0, 800.0]) == [80, 240, 360, 480, 600, 720, 800]
    # The longest rising run wins even when it starts late: here the zeros, not 80 and 240.
    assert repair_order([80.0, 240.0, 0.0, 0.0, 0.0, 720.0, 800.0]) == [0, 0, 0, 0, 0, 720, 800]


def test_repair_output_never_goes_backwards() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        values = (rng.integers(0, 60, size=rng.integers(1, 40)) * 80.0).tolist()
        repaired = repair_order(values)
        assert len(repaired) == len(values) and repaired == sorted(repaired)


# -- audio ------------------------------------------------------------------------------------------------------


def test_audio_is_resampled_to_16k_mono_and_scaled_only_when_it_peaks_above_one() -> None:
    stereo = np.stack([speech_like(1.0), speech_like(1.0, seed=5)], axis=1)  # [samples, channels]
    mono = prepare_audio(stereo, SAMPLE_RATE)
    assert mono.dtype == np.float32 and mono.shape == (16000,)
    np.testing.assert_array_equal(prepare_audio(stereo.T, SAMPLE_RATE), mono)  # [channels, samples] too
    loud = (speech_like(0.5) * 30000).astype(np.int16)
    scaled = prepare_audio(loud, 16000)
    assert float(np.max(np.abs(scaled))) == pytest.approx(1.0)
    quiet = speech_like(0.5) * 0.1
    np.testing.assert_array_equal(prepare_audio(quiet, 16000), quiet)


@pytest.mark.parametrize(("audio", "sample_rate", "message"), [
    (np.zeros(100, dtype=np.float32), 16000, "too short"),
    (np.array([0.0, np.nan] * 500, dtype=np.float32), 16000, "NaN"),
    (np.zeros((2, 2, 100), dtype=np.float32), 16000, "shape"),
    (np.zeros(1000, dtype=np.float32), 0, "sample_rate"),
])
def test_bad_audio_is_refused(aligner: ForcedAligner, audio: np.ndarray, sample_rate: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        aligner.align(audio, sample_rate, "hello", "English")


def test_every_kept_character_belongs_to_a_word() -> None:
    text = "Ça va? Très bien — 谢谢! 123abc 'quoted'"
    covered = {index for word in split_words(text) for index in range(word.start_char, word.end_char)}
    kept = {index for index, char in enumerate(text) if char == "'" or unicodedata.category(char)[0] in "LN"}
    assert kept <= covered
