"""A long text on the eager path, spoken as the engine speaks it: cut at sentences into segments (model/segments.py,
the first a quarter of the budget and each next at most twice the one before), each made with the seed the engine
gives it and, with real weights, the engine's guards (a far-too-early end or a runaway made again once with the
next seed; model/segments.py). Each segment's audio is handed on as soon as it is made, so a chapter never waits in
memory whole.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tts_service.eager.synthesize import EagerSynthesizer
from tts_service.model.prompts import SynthesisInput
from tts_service.model.segments import Segment, SegmentBounds, segment_seed
from tts_service.model.speech_length import estimated_speech_seconds
from tts_service.runner.params import GenerationParams


@dataclass(frozen=True)
class DocumentResult:
    num_segments: int
    num_frames: int
    retries: tuple[str, ...]  # each retried segment's reason, in order
    finish_reason: str  # the last segment's


def synthesize_document(synthesizer: EagerSynthesizer, item: SynthesisInput, params: GenerationParams,
                        segments: list[Segment], write: Callable[[np.ndarray], None],
                        on_segment: Callable[[Segment, int], None]) -> DocumentResult:
    """Speak `item.text` segment by segment into `write`; `params.max_new_frames` caps each segment, and with
    random weights (which never end speech themselves) a segment of several runs as long as reading its text takes.
    A text of one segment is left to `params`, unguarded, as the engine leaves it. `on_segment(segment, frames)`
    follows each segment."""
    model = synthesizer.model
    frame_rate = model.speech_config.frame_rate_hz
    is_segmented = len(segments) > 1
    is_guarded, is_read_out = is_segmented and not model.is_random, is_segmented and model.is_random
    retries: list[str] = []
    num_frames = 0
    finish_reason = "stop"
    for index, segment in enumerate(segments):
        text = segment.of(item.text)
        bounds = SegmentBounds.for_text(text, frame_rate, params.max_new_frames) if is_guarded else None
        cap = (bounds.max_frames if bounds is not None else params.max_new_frames if not is_read_out
               else min(params.max_new_frames, math.ceil(estimated_speech_seconds(text) * frame_rate)))
        for attempt in (0, 1):
            segment_params = dataclasses.replace(params, seed=segment_seed(params.seed, index, attempt),
                                                 max_new_frames=cap, min_new_frames=min(params.min_new_frames, cap))
            result = synthesizer.synthesize([dataclasses.replace(item, text=text)], [segment_params])[0]
            frames = result.codes.shape[0]
            reason = None if bounds is None or attempt == 1 else bounds.verdict(
                result.finish_reason == "stop", result.finish_reason == "length", frames, cap)
            if reason is None:
                break
            retries.append(reason)
        write(result.waveform)
        num_frames += frames
        finish_reason = result.finish_reason
        on_segment(segment, frames)
    return DocumentResult(len(segments), num_frames, tuple(retries), finish_reason)
