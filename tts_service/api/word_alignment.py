"""Word timings as ElevenLabs' character alignment: `chars`, `charStartTimesMs`, `charDurationsMs`.

The engine times words (each a span of the utterance's text, as the client sent it, with its start and end in
seconds from the utterance's first audio). ElevenLabs' clients want one entry per character instead, sent with
the audio messages, and they read the times in two ways (docs/elevenlabs-compat-notes.md, 3.4):
- chunk-relative (ElevenLabs' documented meaning, which Pipecat implements): each message's times count from the
  end of the previous message's alignment, and the client adds up `start + duration` of every message's last
  character to place the next one;
- cumulative (what LiveKit's multi-context connection assumes): every time counts from the utterance's start.
`align` writes either. In both, the characters of a context's messages follow each other without gaps or
overlaps: a character ends where the next one starts, characters between words (spaces, punctuation the aligner
left out) fill the silence between them, and the last character sent ends where its word ends. That contiguity
is what makes the relative reading add up to the same absolute times as the cumulative one.

Times are whole milliseconds, rounded once from the word's seconds, so that summing relative times never drifts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class WordTiming(Protocol):
    """One word: its characters [start_char, end_char) in the utterance's text, its time from the utterance's
    first audio."""

    @property
    def start_char(self) -> int: ...

    @property
    def end_char(self) -> int: ...

    @property
    def start_s(self) -> float: ...

    @property
    def end_s(self) -> float: ...


@dataclass(frozen=True)
class Alignment:
    chars: tuple[str, ...]
    start_times_ms: tuple[int, ...]
    durations_ms: tuple[int, ...]

    def as_json(self) -> dict[str, list[str] | list[int]]:
        return {"chars": list(self.chars), "charStartTimesMs": list(self.start_times_ms),
                "charDurationsMs": list(self.durations_ms)}


@dataclass(frozen=True)
class AlignmentCursor:
    """How much of a context's text its alignment has covered: characters before `next_char` have been sent,
    and the last of them ends `end_ms` after the utterance's first audio."""

    next_char: int = 0
    end_ms: int = 0


def align(words: Sequence[WordTiming], text: str, cursor: AlignmentCursor, cumulative: bool,
          is_last: bool = False) -> tuple[Alignment | None, AlignmentCursor]:
    """The alignment of the characters up to the end of the last of `words` not yet covered (from `cursor`),
    and the cursor after it; None when nothing new is covered. `is_last` (the utterance's last message) adds the
    text left after the last word (a trailing space or punctuation), at the end of the speech and lasting 0 ms,
    which lets a client that splits words at spaces close the last one."""
    starts: list[int] = []
    clock, position = cursor.end_ms, cursor.next_char
    for word in sorted(words, key=lambda word: word.start_char):
        end_char = min(word.end_char, len(text))
        if end_char <= position:
            continue  # covered already (or out of the text)
        start_char = max(word.start_char, position)
        word_start = max(_ms(word.start_s), clock)
        word_end = max(_ms(word.end_s), word_start)
        starts += _spread(start_char - position, clock, word_start)  # between the words: the pause
        starts += _spread(end_char - start_char, word_start, word_end)
        clock, position = word_end, end_char
    if is_last and position < len(text) and (starts or cursor.next_char > 0):
        starts += [clock] * (len(text) - position)
        position = len(text)
    if not starts:
        return None, cursor
    durations = [following - start for start, following in zip(starts, [*starts[1:], clock], strict=True)]
    base = 0 if cumulative else cursor.end_ms
    alignment = Alignment(tuple(text[cursor.next_char:position]), tuple(start - base for start in starts),
                          tuple(durations))
    return alignment, AlignmentCursor(position, clock)


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def _spread(num_chars: int, start_ms: int, end_ms: int) -> list[int]:
    """The start times of `num_chars` characters sharing [start_ms, end_ms) evenly, in whole milliseconds."""
    return [start_ms + (end_ms - start_ms) * index // num_chars for index in range(num_chars)]
