"""A document on the eager path (`qwen3-tts-synthesize --file`): spoken segment by segment as the engine cuts it,
each segment the audio it gets alone with the engine's seed for it, written in order; the guards make a segment
that ends far too early again once with the next seed."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import soundfile

from tts_service.eager import command
from tts_service.eager.document import synthesize_document
from tts_service.eager.synthesize import EagerSynthesizer, SynthesisResult
from tts_service.model.prompts import SynthesisInput
from tts_service.model.segments import document_segments, segment_seed
from tts_service.model.speech_length import estimated_speech_seconds
from tts_service.runner.params import GenerationParams, SamplingParams

TEXT = ("The first sentence is short. The second one is a little longer than that. A third follows here. "
        "And the fourth ends the paragraph.\nA new line starts the next one, which goes on. The end.")
GREEDY = SamplingParams(temperature=0.0, top_k=0, top_p=1.0)


def test_each_segment_is_the_audio_it_gets_alone_with_its_seed_and_they_are_written_in_order(tiny_models,
                                                                                           monkeypatch) -> None:
    model = tiny_models["custom_voice"]
    monkeypatch.setattr(model, "is_random", True)  # unguarded, each segment as long as reading it takes
    synthesizer = EagerSynthesizer(model)
    item = SynthesisInput(text=TEXT, language="english", speaker="vivian", non_streaming_mode=True)
    params = GenerationParams(talker=SamplingParams(temperature=0.9, top_k=50, top_p=1.0), max_new_frames=400,
                              seed=7)
    segments = document_segments(TEXT, 60)
    assert len(segments) > 2 and "".join(segment.of(TEXT) for segment in segments) == TEXT
    written: list[np.ndarray] = []
    result = synthesize_document(synthesizer, item, params, segments, written.append, lambda *_: None)
    assert result.num_segments == len(segments) == len(written) and not result.retries
    for index, segment in enumerate(segments):
        alone = synthesizer.synthesize([dataclasses.replace(item, text=segment.of(TEXT))],
                                       [dataclasses.replace(params, seed=segment_seed(7, index, 0),
                                                            max_new_frames=len(written[index]) // 1920)])[0]
        np.testing.assert_array_equal(written[index], alone.waveform)


def test_a_segment_that_ends_far_too_early_is_made_again_once_with_the_next_seed(tiny_models, monkeypatch) -> None:
    model = tiny_models["custom_voice"]
    synthesizer = EagerSynthesizer(model)
    monkeypatch.setattr(model, "is_random", False)  # the guards are for real weights
    seeds: list[int] = []

    def ends_at_once(items: list[SynthesisInput], params: list[GenerationParams]) -> list[SynthesisResult]:
        seeds.append(params[0].seed)
        return [SynthesisResult(np.zeros(1920, np.float32), 24000, np.zeros((1, 16), np.int64), "stop")]

    monkeypatch.setattr(synthesizer, "synthesize", ends_at_once)
    item = SynthesisInput(text=TEXT, language="english", speaker="vivian", non_streaming_mode=True)
    segments = document_segments(TEXT, 60)
    result = synthesize_document(synthesizer, item, GenerationParams(max_new_frames=400, seed=3), segments,
                                 lambda _: None, lambda *_: None)
    assert result.retries == ("early_end",) * len(segments)
    assert seeds == [segment_seed(3, index, attempt) for index in range(len(segments)) for attempt in (0, 1)]


def test_the_command_speaks_a_file_segment_by_segment_into_one_wav(tmp_path: Path, capsys) -> None:
    document = tmp_path / "chapter.txt"
    document.write_text(TEXT * 3, encoding="utf-8")
    output = tmp_path / "chapter.wav"
    assert command.main(["--file", str(document), "-o", str(output), "--model", "random:tiny-custom_voice",
                         "--device", "cpu", "--max-segment-chars", "200"]) == 0
    info = soundfile.info(str(output))
    assert info.samplerate == 24000 and info.channels == 1
    segments = document_segments(TEXT * 3, 200)
    assert len(segments) > 1
    # Random weights: each segment runs as long as reading it takes.
    assert info.frames == 1920 * sum(math.ceil(estimated_speech_seconds(segment.of(TEXT * 3)) * 12.5)
                                     for segment in segments)
    assert f"{info.frames / 24000:.2f} s of audio in {len(segments)} segments" in capsys.readouterr().out


def test_the_command_wants_the_text_or_a_file_but_not_both(tmp_path: Path) -> None:
    document = tmp_path / "chapter.txt"
    document.write_text(TEXT, encoding="utf-8")
    assert command.main(["Hello.", "--file", str(document), "--model", "random:tiny-custom_voice",
                         "--device", "cpu"]) == 2
    assert command.main(["--model", "random:tiny-custom_voice", "--device", "cpu"]) == 2
