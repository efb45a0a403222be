"""Long text cut into segments that the model speaks one after another, in the same voice, as one stream.

A segment is a run of whole sentences of at most `max_chars` characters; with `first_chars`, the first segment's
budget is that and each next one's twice the one before (up to `max_chars`), so that a segment is short where it
must be made before its audio can start, and each can be made while the one before it plays.

A sentence ends at terminal punctuation (Latin: `.`, `!`, `?`, `…`, with any closing quotes or brackets, before a
space or the end; CJK: `。！？；`, with closing quotes or brackets) or at a line break. A sentence longer than
`max_chars` is cut at its clauses (`,;:` and dashes before a space; CJK `，、；：`), a clause longer than that between
words (at a space, or between two CJK characters, each of which is a word), never inside a word: a single word
longer than `max_chars` is a segment of its own, however long. The segments cover the text exactly, in order (each
keeps the spaces after it), so that offsets into a segment lead back to the text as sent; a piece with nothing to
say (only spaces or punctuation) joins the segment beside it (so a segment may pass its budget by that piece).

Each segment is made with a seed derived from the request's (`segment_seed`), and, with real weights, watched by
`SegmentBounds`: an end far too early for its text, or a run far past what it can need, is made again once. The
engine (engine/segmented.py, engine/streamed_segments.py) and the offline command (eager/document.py) share them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tts_service.model.aligner_text import is_cjk
from tts_service.model.speech_length import estimated_speech_seconds

_SEED_RANGE = 2**32
# A retry's seed steps this far from the seed it replaces: far from the seeds of the request's other segments.
_RETRY_SEED_STEP = 0x9E3779B9
# The first segment's share of the segment budget.
FIRST_SEGMENT_SHARE = 4
# A segment that ends before this share of the time its text takes to read ended too early; one that runs past this
# factor of it (plus the margin) has run away.
EARLY_END_SHARE = 0.25
RUNAWAY_FACTOR = 3.0
RUNAWAY_MARGIN_S = 2.0


@dataclass(frozen=True)
class SegmentBounds:
    """What a segment's text can plausibly take, in frames: an end before `min_frames` is too early; `max_frames`
    is its cap, past which, when it is the runaway bound and not the generation limit, it has run away."""

    min_frames: int
    max_frames: int
    is_runaway_bound: bool

    @classmethod
    def for_text(cls, text: str, frame_rate_hz: float, max_frames: int) -> SegmentBounds:
        seconds = estimated_speech_seconds(text)
        runaway = math.ceil((RUNAWAY_FACTOR * seconds + RUNAWAY_MARGIN_S) * frame_rate_hz)
        return cls(min_frames=int(EARLY_END_SHARE * seconds * frame_rate_hz), max_frames=min(max_frames, runaway),
                   is_runaway_bound=runaway < max_frames)

    def verdict(self, is_stopped: bool, is_at_cap: bool, num_frames: int, cap: int) -> str | None:
        """Why a segment that ended so (by its end of speech, or at its cap) must be made again (`early_end`,
        `runaway`), or None: it ended within bounds, or at a cap that is not the runaway bound (the generation
        limit, or what the request had left)."""
        if is_stopped and num_frames < self.min_frames:
            return "early_end"
        if is_at_cap and self.is_runaway_bound and cap == self.max_frames:
            return "runaway"
        return None


def segment_seed(seed: int, index: int, attempt: int) -> int:
    """The seed of a long text's segment `index` at its `attempt`-th making: reproducible from the request's."""
    return (seed + index + attempt * _RETRY_SEED_STEP) % _SEED_RANGE


_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s|$)|[。！？；]+[”’」』）]*|\n")
_CLAUSE_END = re.compile(r"[,;:—–]+[\"'”’)\]]*(?=\s)|[，、；：]")
_SPACES = re.compile(r"\s*")


@dataclass(frozen=True)
class Segment:
    """`text[start:end]` of the text it was cut from."""

    start: int
    end: int

    def of(self, text: str) -> str:
        return text[self.start:self.end]


def split_segments(text: str, max_chars: int, first_chars: int | None = None) -> list[Segment]:
    """`text` cut into segments of at most `max_chars` characters, the first `first_chars` and each next one twice
    the one before when given (see the module's docstring); none when it has nothing to say."""
    if max_chars < 1 or (first_chars is not None and first_chars < 1):
        raise ValueError(f"max_chars and first_chars must be >= 1, got {max_chars} and {first_chars}")
    pieces = [piece for sentence in _spans(text, 0, len(text), _SENTENCE_END)
              for piece in _fitted(text, sentence, max_chars)]

    def budget(index: int) -> int:
        return max_chars if first_chars is None else min(max_chars, first_chars << min(index, 62))

    segments: list[Segment] = []
    leading: int | None = None  # where wordless pieces before the first word start
    for start, end in _packed(pieces, budget, lambda: len(segments)):
        if _has_words(text[start:end]):
            segments.append(Segment(start if leading is None else leading, end))
            leading = None
        elif segments:
            segments[-1] = Segment(segments[-1].start, end)
        elif leading is None:
            leading = start
    return segments


def document_segments(text: str, max_chars: int) -> list[Segment]:
    """A whole text's segments as the engine speaks them: the text itself within `max_chars`; past it, cut with the
    first segment a quarter of the budget (`FIRST_SEGMENT_SHARE`), or, for a text with nothing to say, one segment."""
    if len(text) <= max_chars:
        return [Segment(0, len(text))]
    return split_segments(text, max_chars, max(1, max_chars // FIRST_SEGMENT_SHARE)) or [Segment(0, len(text))]


def sentence_ends(text: str) -> list[int]:
    """Where each sentence of `text` ends, the spaces after it included (the end of a text that goes on may not be
    one yet)."""
    ends = []
    for match in _SENTENCE_END.finditer(text):
        spaces = _SPACES.match(text, match.end())
        ends.append(spaces.end() if spaces is not None else match.end())
    return ends


def _has_words(piece: str) -> bool:
    return any(character.isalnum() for character in piece)


def _spans(text: str, start: int, end: int, boundary: re.Pattern[str]) -> Iterator[tuple[int, int]]:
    """`text[start:end]` cut after each match of `boundary` and the spaces that follow it."""
    position = start
    for match in boundary.finditer(text, start, end):
        cut = _SPACES.match(text, match.end(), end).end()  # type: ignore[union-attr]
        if cut > position:
            yield position, cut
            position = cut
    if position < end:
        yield position, end


def _fitted(text: str, span: tuple[int, int], max_chars: int) -> Iterator[tuple[int, int]]:
    """A sentence as it is, or cut at clauses and then between words until every piece fits (a word never cut)."""
    start, end = span
    if end - start <= max_chars:
        yield span
        return
    def fixed(_: int) -> int:
        return max_chars

    for clause in _packed(list(_spans(text, start, end, _CLAUSE_END)), fixed):
        if clause[1] - clause[0] <= max_chars:
            yield clause
        else:
            yield from _packed(list(_words(text, *clause)), fixed)


def _words(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    """Each word with the spaces after it; each CJK character is a word of its own."""
    position = start
    index = start
    while index < end:
        character = text[index]
        if character.isspace():
            index = _SPACES.match(text, index, end).end()  # type: ignore[union-attr]
            yield position, index
            position = index
            continue
        if is_cjk(character) and index > position:
            yield position, index
            position = index
        index += 1
        if is_cjk(character) and index < end and not text[index].isspace():
            yield position, index
            position = index
    if position < end:
        yield position, end


def _packed(pieces: list[tuple[int, int]], budget: Callable[[int], int],
            num_emitted: Callable[[], int] | None = None) -> Iterator[tuple[int, int]]:
    """Consecutive pieces joined while the join fits the budget of the run being built (`budget` of its index:
    `num_emitted()` when given, else how many runs came before)."""
    current: tuple[int, int] | None = None
    count = 0
    for start, end in pieces:
        index = count if num_emitted is None else num_emitted()
        if current is not None and end - current[0] <= budget(index):
            current = (current[0], end)
            continue
        if current is not None:
            yield current
            count += 1
        current = (start, end)
    if current is not None:
        yield current
