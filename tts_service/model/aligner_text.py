"""The forced aligner's text side: which words of a text get timestamps, and turning predicted classes into times.

Words are cut as the reference (qwen-asr 0.0.6) cuts them for every language but Japanese and Korean: the text is
split at whitespace, each piece keeps only its letters, digits and apostrophes, and inside a piece every CJK
ideograph is a word of its own while each run of other kept characters is one word. Here each word also keeps
where it lies in the caller's text, so timings map back to character offsets without searching for the words again
(a search would trip over repeated words and over words whose punctuation was dropped: "U.S." is the word "US").

The model predicts a class for each word's start and end; classes that break the order are repaired by the
reference's rule (`repair_order`) before they become times.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

# The reference splits these languages with nagisa (Japanese) and soynlp (Korean); the words those give are not
# the whitespace words, so aligning them here would not match it.
UNSUPPORTED_LANGUAGES = ("japanese", "korean")
# Runs of at most this many out-of-order values take the nearer neighbour's value; longer runs are interpolated.
_SHORT_RUN = 2

# The ranges the reference counts as CJK ideographs: unified ideographs, extensions A to E, compatibility ideographs.
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B820, 0x2CEAF), (0xF900, 0xFAFF))
# The same ranges as one character class: a text's CJK characters are found and counted at the regex engine's speed,
# where a test of each range for each character took a word tracker a quarter of the front door's time.
_CJK_CHARACTER = re.compile("[" + "".join(f"{chr(low)}-{chr(high)}" for low, high in _CJK_RANGES) + "]")


class UnsupportedLanguageError(ValueError):
    """The text's language needs a word splitter this implementation does not have."""


@dataclass(frozen=True)
class Word:
    """One word the model times: its text as the model reads it, and where it lies in the caller's text."""

    text: str
    start_char: int  # the offset of its first kept character
    end_char: int  # one past its last kept character (and the combining marks right after it)


def is_cjk(char: str) -> bool:
    return _CJK_CHARACTER.match(char) is not None


def num_cjk(text: str) -> int:
    """How many of the text's characters are CJK ideographs (as `is_cjk` counts them)."""
    return len(_CJK_CHARACTER.findall(text))


def is_kept(char: str) -> bool:
    """Letters, digits and the apostrophe (so "don't" stays one word); everything else is dropped."""
    return char == "'" or unicodedata.category(char)[0] in "LN"


def split_words(text: str, language: str | None = None) -> list[Word]:
    """The words the aligner times in `text`, in order, with their character offsets."""
    if language is not None and language.lower() in UNSUPPORTED_LANGUAGES:
        raise UnsupportedLanguageError(
            f"aligning {language} text is not supported: the reference cuts it into words with a dictionary-based "
            f"splitter (nagisa for Japanese, soynlp for Korean) that this service does not carry")
    words: list[Word] = []
    for start, end in _pieces(text):
        words += _piece_words(text, start, end)
    return words


def _pieces(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each run of non-whitespace, whitespace as `str.split()` knows it."""
    start = None
    for index, char in enumerate(text):
        if char.isspace():
            if start is not None:
                yield start, index
            start = None
        elif start is None:
            start = index
    if start is not None:
        yield start, len(text)


def _piece_words(text: str, start: int, end: int) -> list[Word]:
    """The words of one whitespace piece: each ideograph alone, each run of other kept characters together."""
    words: list[Word] = []
    run: list[int] = []  # offsets of the kept characters of the current run

    def close_run() -> None:
        if run:
            words.append(_word(text, run, end))
            run.clear()

    for index in range(start, end):
        char = text[index]
        if not is_kept(char):
            continue  # dropped: it neither joins nor ends a run ("U.S." is one word)
        if is_cjk(char):
            close_run()
            words.append(_word(text, [index], end))
        else:
            run.append(index)
    close_run()
    return words


def _word(text: str, offsets: list[int], piece_end: int) -> Word:
    stop = offsets[-1] + 1
    # A combining mark belongs to the letter before it, though the reference drops it from the word's text.
    while stop < piece_end and unicodedata.category(text[stop]).startswith("M"):
        stop += 1
    return Word("".join(text[index] for index in offsets), offsets[0], stop)


def repair_order(values: Sequence[float]) -> list[int]:
    """Predicted times (ms) made non-decreasing by the reference's rule, truncated to whole milliseconds.

    The longest non-decreasing subsequence stays (ties resolved as the reference resolves them); each run of
    values outside it is replaced: a run of one or two by its nearer kept neighbour (the left one on a tie), a
    longer run by evenly spaced values between its kept neighbours, or by the one neighbour it has.
    """
    if not values:
        return []
    kept = _longest_rising(np.asarray(values, dtype=np.float64))
    result = [float(value) for value in values]
    index = 0
    while index < len(result):
        if kept[index]:
            index += 1
            continue
        stop = index
        while stop < len(result) and not kept[stop]:
            stop += 1
        left = next((result[k] for k in range(index - 1, -1, -1) if kept[k]), None)
        right = next((result[k] for k in range(stop, len(result)) if kept[k]), None)
        result[index:stop] = _fill(index, stop, left, right)
        index = stop
    return [int(value) for value in result]


def _longest_rising(values: np.ndarray) -> list[bool]:
    """Which values belong to the longest non-decreasing subsequence.

    Each value extends the longest chain ending at an earlier value no larger than it, the earliest such chain on
    a tie, and the chosen chain is the earliest of the longest: the reference's O(n^2) rule, vectorised per value.
    """
    count = len(values)
    lengths = np.ones(count, dtype=np.int64)
    parents = np.full(count, -1, dtype=np.int64)
    for index in range(1, count):
        candidates = np.flatnonzero(values[:index] <= values[index])
        if candidates.size:
            best = candidates[np.argmax(lengths[candidates])]  # argmax: the first of the longest
            lengths[index] = lengths[best] + 1
            parents[index] = best
    kept = [False] * count
    node = int(np.argmax(lengths))
    while node != -1:
        kept[node] = True
        node = int(parents[node])
    return kept


def _fill(start: int, stop: int, left: float | None, right: float | None) -> list[float]:
    """Values for the out-of-order run [start, stop) between its kept neighbours' values."""
    length = stop - start
    if left is None or right is None:
        only = left if right is None else right
        assert only is not None  # a kept value always exists: the subsequence is never empty
        return [only] * length
    if length <= _SHORT_RUN:
        # Distance to the kept neighbour on each side; the left one wins a tie.
        return [left if index - (start - 1) <= stop - index else right for index in range(start, stop)]
    step = (right - left) / (length + 1)
    return [left + step * (index - start + 1) for index in range(start, stop)]


def class_times_ms(classes: Sequence[int], segment_ms: float) -> list[float]:
    """Timestamp classes to milliseconds, multiplied in float32 as the reference multiplies its tensor."""
    product = np.asarray(classes, dtype=np.float32) * np.float32(segment_ms)
    return [float(value) for value in product]


def word_times_s(classes: Sequence[int], segment_ms: float) -> list[tuple[float, float]]:
    """(start, end) in seconds for each word, from its two predicted classes (start, end, start, end, ...)."""
    repaired = repair_order(class_times_ms(classes, segment_ms))
    seconds = [round(ms / 1000.0, 3) for ms in repaired]
    return list(zip(seconds[0::2], seconds[1::2], strict=True))
