"""Word timestamps beside the audio: when each word of a request's text is spoken, sentence by sentence, as soon as
its audio exists.

The forced aligner (`tts_service.model.aligner`, loaded with `--aligner-model`) runs beside the engine, which
aligns the open windows of every request that asked together, a batch at a time (`EngineDoor.align_words`, see
`tts_service.engine.aligner_worker`). Each request's `WordTracker` keeps its text as the client sent it and its
audio as it is generated, and aligns the window that starts where its last committed word ended: the audio since
then against the text not yet committed, as far as that audio can have said it. Words are committed a sentence at a
time, once the aligner places the sentence's last word at least `_MARGIN_S` before the end of the audio so far (the
model has moved on to the next sentence); when the request ends, the rest is committed. A window is aligned only
once it could hold the first uncommitted sentence that more text follows, at a fast pace; after an alignment that
commits nothing the window must double first. So timings trail their audio by about a sentence, playback never
waits for them, every spoken word of the text gets one, and the aligner runs about once a sentence.

A document (a text spoken in segments, up to a book chapter) is tracked the same way, with two bounds that keep
each alignment the size of a few sentences whatever the length: the text a window is aligned against stops at the
first sentence end past what its audio could say at a fast pace plus `_LOOKAHEAD_S`, and a window's audio is at
most `_MAX_WINDOW_S`; a window that reaches it commits at least its first sentence, so the tracker never falls
further behind (random weights, whose timings are noise, commit nothing on their own).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import numpy as np

from tts_service.api.errors import ApiError, invalid
from tts_service.engine import AlignmentItem, WordTiming
from tts_service.model.aligner_text import is_cjk, num_cjk

# Where a sentence ends: terminal punctuation (and closing quotes or brackets) before a space or the end, any
# CJK terminal mark, or a line break.
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s|$)|[。！？；]+[”’」』）]*|\n")
# A sentence is committed when the aligner ends its last word this long before the audio so far ends.
_MARGIN_S = 0.3
# A window is aligned only once it holds at least the time its complete sentences need at a fast pace (these
# characters a second), and after an alignment that committed nothing only once it has grown by this factor: so a
# sentence is aligned about once, and a window that commits nothing (random weights never do) a few times.
_FAST_LATIN_CHARS_PER_S = 25.0
_FAST_CJK_CHARS_PER_S = 10.0
_RETRY_GROWTH = 2.0
# The text a window is aligned against runs this far (at a fast pace) past what its audio can have said, and its
# audio is at most this long: a few sentences either way, well inside the aligner's largest captured batch (64 s).
_LOOKAHEAD_S = 10.0
_MAX_WINDOW_S = 30.0
# How far past the text's bound a sentence end is looked for before the text is cut at a word instead.
_MAX_SENTENCE_SEARCH_CHARS = 2000
# Exactly the characters str.isalnum() accepts (a word character that is not the underscore), counted by the regex
# engine: a tracker counts them in its open text at every chunk of audio.
_ALPHANUMERIC = re.compile(r"[^\W_]")
# Languages whose words the aligner cuts with tools of its own, which are not here (see aligner_text).
_UNSUPPORTED_LANGUAGES = frozenset({"japanese", "korean"})


@dataclass(frozen=True)
class TimedWord:
    """One word of a request's text (character offsets into the text as the client sent it) and when its audio
    speaks it (seconds from the request's first sample)."""

    word: str
    start_char: int
    end_char: int
    start_s: float
    end_s: float


def check_word_timestamps(aligner: str | None, language: str, field: str) -> None:
    """A request may ask for word timestamps only from a server with an aligner (`aligner`: the one loaded), in a
    language it can cut."""
    if aligner is None:
        raise ApiError(grpc.StatusCode.FAILED_PRECONDITION,
                       f"{field}: this server has no forced aligner; start it with --aligner-model (e.g. "
                       "Qwen/Qwen3-ForcedAligner-0.6B) to get word timestamps", field=field)
    if language.lower() in _UNSUPPORTED_LANGUAGES:
        raise invalid(field, f"word timestamps are not available for {language.lower()} text")


def word_timestamps_language(aligner: str | None, request: Any, field: str) -> str | None:
    """The language to cut a request's words in, when it asks for word timestamps (a SynthesizeRequest or a
    StreamingSynthesizeConfig); None when it does not."""
    if not request.word_timestamps:
        return None
    check_word_timestamps(aligner, request.voice.language, field)
    return request.voice.language


Align = Callable[[AlignmentItem], Awaitable[list[WordTiming]]]


class OffsetMap(Protocol):
    """Leads a span of the text as said back to the text as sent (a lexicon's substitution)."""

    def original_span(self, spoken_start: int, spoken_end: int) -> tuple[int, int]: ...


class WordTracker:
    """One request's word timings: its text and audio as they arrive, and its words committed sentence by
    sentence (see the module's docstring), handed out by `take_words`."""

    def __init__(self, align: Align, sample_rate: int, language: str | None, text: str = "",
                 is_text_closed: bool = False, mapping: OffsetMap | None = None, original: str = "") -> None:
        self._align = align
        # With a lexicon: `text` is what is said, and each word is named by its span of the text as sent.
        self._mapping = mapping
        self._original = original
        self._sample_rate = sample_rate
        self._language = language
        self._ready: list[TimedWord] = []
        self.text = text
        self._is_text_closed = is_text_closed
        self._chunks: list[np.ndarray] = []  # the audio from sample `_chunks_start` on
        self._chunks_start = 0
        self._num_samples = 0
        self._committed_chars = 0  # the text before this has its words committed
        self._window_start = 0  # the sample where the uncommitted words' audio starts
        self._next_attempt_samples = 0  # the window's length before it is worth aligning again
        # `_worth_aligning_from`'s answer, while the open text it was found for stands (see `_is_worth_aligning`).
        self._worth_for: tuple[int, int, bool] | None = None
        self._worth_from_samples: float | None = None
        self._aligning: asyncio.Task[None] | None = None

    def take_words(self) -> tuple[TimedWord, ...]:
        """The words committed since the last call."""
        words, self._ready = tuple(self._ready), []
        return words

    def add_text(self, spoken: str, original: str = "") -> None:
        """The text's next part as said, and (with a lexicon) as sent."""
        self.text += spoken
        self._original += original

    def close_text(self) -> None:
        self._is_text_closed = True

    def add_audio(self, samples: np.ndarray, is_last: bool = False) -> None:
        """The request's next audio; `is_last`: all of it, aligned at once by `finish`."""
        self._chunks.append(samples)
        self._num_samples += samples.shape[0]
        if not is_last and self._aligning is None and self._is_worth_aligning():
            self._aligning = asyncio.create_task(self._align_window(is_final=False))

    async def finish(self) -> None:
        """The request has ended: commit every word left, after any alignment in flight."""
        if self._aligning is not None:
            await self._aligning
        self._is_text_closed = True
        await self._align_window(is_final=True)

    async def cancel(self) -> None:
        if self._aligning is not None:
            self._aligning.cancel()
            await asyncio.gather(self._aligning, return_exceptions=True)

    def _is_worth_aligning(self) -> bool:
        """Whether the window could hold the first spoken sentence that is not yet committed. Asked at every chunk
        of audio, it scans the open text again only when the answer could have changed: a longer window's open text
        only extends a shorter one's, so a first sentence once found stays the same sentence (needing the same
        window), and one not found in the whole of the open text stays unfound, until text comes or words are
        committed."""
        window = self._num_samples - self._window_start
        if window < self._next_attempt_samples:
            return False
        state = (len(self.text), self._committed_chars, self._is_text_closed)
        if state != self._worth_for:
            needed, is_settled = self._worth_aligning_from(window)
            self._worth_for, self._worth_from_samples = (state if is_settled else None), needed
        return self._worth_from_samples is not None and window >= self._worth_from_samples

    def _worth_aligning_from(self, window: int) -> tuple[float | None, bool]:
        """The window (samples) that could hold the first sentence of the open text, as a window of `window`
        samples sees it, that more text follows (None: no such sentence); and whether a longer window would find
        the same (False only where this one's open text was cut short of the text known)."""
        text, is_cut = self._open_text_and_cut(window / self._sample_rate)
        end = _first_sentence_end_before_more(text)
        if end == 0:
            return None, not is_cut
        return (_fastest_speech_s(text[:end]) + _MARGIN_S) * self._sample_rate, True

    def _open_text(self, window_s: float) -> str:
        return self._open_text_and_cut(window_s)[0]

    def _open_text_and_cut(self, window_s: float) -> tuple[str, bool]:
        """The text not yet committed, as far as a window of `window_s` can have said it (see the module's
        docstring), up to its last complete word (all of it once the text is closed and within the bound); and
        whether that bound cut it short of the text known."""
        start = self._committed_chars
        # Fast speech says fewer than this many characters a second, spaces and punctuation included.
        max_chars = math.ceil((window_s + _LOOKAHEAD_S) * _FAST_LATIN_CHARS_PER_S * 2)
        text = self.text[start:start + max_chars + _MAX_SENTENCE_SEARCH_CHARS]
        end = _sentence_end_past(text, window_s + _LOOKAHEAD_S)
        if end is not None:
            return text[:end], True
        is_cut = start + len(text) < len(self.text)
        if self._is_text_closed and not is_cut:
            return text, False
        return text[:_last_word_break(text)], is_cut

    async def _align_window(self, is_final: bool) -> None:
        try:
            while True:
                audio = self._window_audio()
                window_s = audio.shape[0] / self._sample_rate
                text = self._open_text(window_s)
                if not text.strip() or audio.shape[0] < self._sample_rate // 50:
                    if is_final:
                        self._committed_chars = len(self.text)
                    return
                words = await self._align(AlignmentItem(audio, self._sample_rate, text, self._language))
                is_whole = is_final and self._committed_chars + len(text) == len(self.text)
                is_full = window_s >= _MAX_WINDOW_S
                is_committed = self._commit(words, text, window_s, is_final, is_whole, is_full)
                self._next_attempt_samples = 0 if is_committed else round(audio.shape[0] * _RETRY_GROWTH)
                if not is_final and not self._is_worth_aligning():
                    return
                if is_final and (is_whole or not is_committed):
                    if not is_whole:  # the audio is spent: the words left were never spoken
                        self._committed_chars = len(self.text)
                    return
        finally:
            if not is_final:
                self._aligning = None

    def _window_audio(self) -> np.ndarray:
        if len(self._chunks) > 1 or self._chunks_start < self._window_start:
            # The audio before the window is never aligned again: only the window's is kept (a copy, so that a
            # document's hour of samples is not held by a view of it).
            audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, dtype=np.float32)
            self._chunks = [audio[self._window_start - self._chunks_start:].copy()]
            self._chunks_start = self._window_start
        audio = self._chunks[0] if self._chunks else np.zeros(0, dtype=np.float32)
        return audio[:round(_MAX_WINDOW_S * self._sample_rate)]

    @property
    def buffered_seconds(self) -> float:
        """The audio this tracker holds: its open window's, and what came since it was last aligned."""
        return sum(chunk.shape[0] for chunk in self._chunks) / self._sample_rate

    def _commit(self, words: Sequence[WordTiming], text: str, window_s: float, is_final: bool, is_whole: bool,
                is_full: bool) -> bool:
        """Commit the words of the window's complete, spoken sentences (all of them when `is_whole`; at least the
        first when the window `is_full`; once the request has ended, those that end by the audio's end); whether
        any."""
        spoken_until = window_s - (0.0 if is_final else _MARGIN_S)
        end = len(text) if is_whole else self._spoken_sentences_end(words, text, spoken_until)
        if end == 0 and is_full:
            end = _first_sentence_end_before_more(text) or len(text)
        chosen = [word for word in words if word.end_char <= end]
        if not chosen:
            return False
        offset_chars, offset_s = self._committed_chars, self._window_start / self._sample_rate
        committed = tuple(TimedWord(text[word.start_char:word.end_char], word.start_char + offset_chars,
                                    word.end_char + offset_chars, word.start_s + offset_s, word.end_s + offset_s)
                          for word in chosen)
        following = next((word.start_char for word in words if word.end_char > end), len(text))
        self._committed_chars += following
        # Never backwards: a window's words start at or after its start.
        self._window_start += round(chosen[-1].end_s * self._sample_rate)
        self._ready += committed if self._mapping is None else self._as_sent(committed)
        return True

    def _as_sent(self, words: Sequence[TimedWord]) -> list[TimedWord]:
        """Spoken words named by their spans of the text as sent; the words of one alias become its grapheme."""
        assert self._mapping is not None
        named: list[TimedWord] = []
        for word in words:
            start, end = self._mapping.original_span(word.start_char, word.end_char)
            if named and named[-1].start_char == start and named[-1].end_char == end:
                named[-1] = dataclasses.replace(named[-1], end_s=word.end_s)
            else:
                named.append(TimedWord(self._original[start:end], start, end, word.start_s, word.end_s))
        return named

    @staticmethod
    def _spoken_sentences_end(words: Sequence[WordTiming], text: str, spoken_until: float) -> int:
        """The end of the last sentence whose words all end by `spoken_until`; 0: none."""
        best = 0
        for match in _SENTENCE_END.finditer(text):
            sentence_words = [word for word in words if word.end_char <= match.end()]
            if sentence_words and all(word.end_s <= spoken_until for word in sentence_words):
                best = match.end()
            else:
                break
        return best



def _first_sentence_end_before_more(text: str) -> int:
    """The end of the text's first sentence that more text follows (0: none). The last sentence of what is known
    is timed when more text comes or the request ends: before that its words could be the last it speaks."""
    return next((match.end() for match in _SENTENCE_END.finditer(text) if text[match.end():].strip()), 0)


def _sentence_end_past(text: str, seconds: float) -> int | None:
    """The first sentence end of `text` past which reading it at a fast pace takes longer than `seconds`; None if
    the whole of it takes less."""
    spoken_s = 0.0
    start = 0
    for match in _SENTENCE_END.finditer(text):
        spoken_s += _fastest_speech_s(text[start:match.end()])
        start = match.end()
        if spoken_s > seconds and text[start:].strip():
            return start
    return None


def _fastest_speech_s(text: str) -> float:
    """The least time speaking `text` can take: each CJK character and each other letter or digit at a fast pace."""
    cjk = num_cjk(text)
    other = len(_ALPHANUMERIC.findall(text)) - cjk
    return other / _FAST_LATIN_CHARS_PER_S + cjk / _FAST_CJK_CHARS_PER_S


def _last_word_break(text: str) -> int:
    """Where the text's last complete word ends: a word running to the end of open text may still go on."""
    index = len(text)
    while index > 0 and not (text[index - 1].isspace() or _is_cut_anywhere(text[index - 1])):
        index -= 1
    return index


def _is_cut_anywhere(character: str) -> bool:
    """Punctuation ends a word where it stands, and so does a CJK character: the aligner's own rule."""
    return not character.isalnum() or is_cjk(character)
