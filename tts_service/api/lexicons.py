"""Pronunciation lexicons: words or phrases of the text (graphemes) and what to say in their place (aliases), applied
to the text before tokenization, with a map from the spoken text back to the original one.

The rules, exactly as implemented (tests/service/test_lexicons.py proves each):

- **Whole words.** A match never splits a word: it does not begin between two word characters, nor end between two
  word characters. A word character is a letter, a combining mark, a number or "_" (Unicode categories L*, M*, N*),
  except the characters of scripts written without spaces between words (Han, Hiragana, Katakana, Hangul, Bopomofo,
  Thai, Lao, Khmer, Myanmar): each of those is a word of its own, so a grapheme in them matches anywhere, and a
  Latin grapheme next to them matches too ("SQL" in "SQL数据库"). A grapheme that begins or ends with punctuation
  has no boundary to respect on that side ("e.g." matches in "e.g.,"; "&" matches in "R&D").
- **Whole characters.** No match begins on a combining mark or ends right before one (it would cut a letter in two).
- **Case.** A grapheme with no uppercase (or titlecase) letter matches the text in any case ("sql" matches "SQL",
  "Sql"); a grapheme with any matches only that exact spelling ("US" does not match "us"). Comparing case, a
  character is compared by its own lowercase form (final and medial sigma count as one letter).
- **Whitespace.** Whitespace around a grapheme is ignored; inside it, any run of whitespace matches any run of
  whitespace in the text ("New York" matches "New\\n  York").
- **Which match.** The text is read from the left: the leftmost match wins, and at one position the longest; where
  an exact-case grapheme and a case-free one match the same text ("SQL" and "sql" on "SQL"), the exact one wins.
- **Once.** An alias is never matched again: matching reads only the original text.
- **Spacing.** An alias is said without the whitespace around it, and with one space added on a side where both it
  and the text next to it are word characters, so that it never fuses with a neighbouring word ("R&D" with
  "&" -> "and" becomes "R and D").
- **Duplicates.** Two entries of one lexicon may not have graphemes that match exactly the same texts; combining
  lexicons (`Lexicon.combined`), a later lexicon's entry replaces an earlier one's for such a grapheme.

Not done: Unicode normalization (a grapheme in composed form does not match the same letters decomposed in the
text), and case mappings that change a character's length ("İ", "ß" match only themselves).

`Lexicon.apply(text)` substitutes a whole text; `StreamingSubstitution` does the same for text that arrives in
fragments, giving out each part as soon as no later fragment can change it, and its output equals `apply`'s for
every way of splitting the text. Both read the text once, whatever the number of entries: a trie of the folded
graphemes is walked from each position where a grapheme could begin.
"""

from __future__ import annotations

import bisect
import functools
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import InitVar, dataclass

from tts_service.api.errors import invalid

MAX_ENTRIES = 1_000
# A request's own entries and the registered lexicons it names, together.
MAX_COMBINED_ENTRIES = 10_000
MAX_GRAPHEME_CHARS = 100
MAX_ALIAS_CHARS = 200

# Code point ranges of scripts written without spaces between words (plus their punctuation and symbol blocks,
# which are no word characters anyway), sorted.
_SPACELESS_RANGES = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x1780, 0x17FF),  # Khmer
    (0x19E0, 0x19FF),  # Khmer symbols
    (0x2E80, 0x2FDF),  # CJK and Kangxi radicals
    (0x3000, 0x33FF),  # CJK symbols, Hiragana, Katakana, Bopomofo, Hangul compatibility Jamo, Kanbun, CJK strokes
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xA960, 0xA97F),  # Hangul Jamo extended A
    (0xAC00, 0xD7FF),  # Hangul syllables, Jamo extended B
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF66, 0xFFDC),  # halfwidth Katakana and Hangul
    (0x1AFF0, 0x1B16F),  # Kana extended and supplement
    (0x20000, 0x3FFFF),  # CJK extensions B and later
)
_SPACELESS_STARTS = tuple(start for start, _ in _SPACELESS_RANGES)
_SPACELESS_CLASS = "".join(f"\\U{start:08x}-\\U{end:08x}" for start, end in _SPACELESS_RANGES)
_WHITESPACE_RUN = re.compile(r"\s+")
# Characters that may appear in no grapheme or alias: controls (a line break would also split the text the model
# reads) and surrogates (which cannot be encoded, in a message or a file).
_FORBIDDEN_CATEGORIES = {"Cc", "Cs"}


@dataclass(frozen=True)
class LexiconEntry:
    """Say `alias` wherever the text has `grapheme`."""

    grapheme: str
    alias: str

    @property
    def is_case_sensitive(self) -> bool:
        """Whether the grapheme has an uppercase or titlecase letter, and so matches only its own spelling."""
        return self.grapheme != self.grapheme.lower()

    @property
    def words(self) -> str:
        """The grapheme with each whitespace run made one space, and none around it."""
        return " ".join(self.grapheme.split())

    @property
    def match_key(self) -> tuple[bool, str]:
        """Equal for two entries exactly when their graphemes match the same texts."""
        if self.is_case_sensitive:
            return True, self.words
        return False, "".join(_fold(character) for character in self.words)


@dataclass(frozen=True)
class Replacement:
    """One substitution: original[original_start:original_end] was said as spoken[spoken_start:spoken_end]."""

    original_start: int
    original_end: int
    spoken_start: int
    spoken_end: int
    entry: LexiconEntry


@dataclass(frozen=True)
class Substituted:
    """A text with a lexicon applied: what is said, and where each part of it came from."""

    original: str
    spoken: str
    replacements: tuple[Replacement, ...]

    def original_span(self, spoken_start: int, spoken_end: int) -> tuple[int, int]:
        """The span of the original text that spoken[spoken_start:spoken_end] stands for: a span touching an alias
        takes the whole of its grapheme's span, and text outside every alias maps one to one."""
        return _original_span(self.replacements, len(self.spoken), spoken_start, spoken_end)


@dataclass(frozen=True)
class Lexicon:
    """Entries checked on construction; an error names the field as `<where>.entries[<index>].<field>`, `where`
    being the field the entries came from in the caller's request."""

    entries: tuple[LexiconEntry, ...] = ()
    where: InitVar[str] = "lexicon"

    def __post_init__(self, where: str) -> None:
        object.__setattr__(self, "entries", tuple(self.entries))
        if len(self.entries) > MAX_ENTRIES:
            raise invalid(f"{where}.entries", f"has {len(self.entries)} entries; at most {MAX_ENTRIES} are accepted")
        first_index: dict[tuple[bool, str], int] = {}
        for index, entry in enumerate(self.entries):
            field = f"{where}.entries[{index}]"
            _check_entry(field, entry)
            earlier = first_index.setdefault(entry.match_key, index)
            if earlier != index:
                raise invalid(f"{field}.grapheme", f"matches the same text as {where}.entries[{earlier}].grapheme; "
                                                   "give each grapheme once")

    @classmethod
    def combined(cls, lexicons: Iterable[Lexicon], where: str = "lexicons") -> Lexicon:
        """One lexicon holding every entry of `lexicons`; where two graphemes match the same texts, the one of the
        later lexicon is kept. At most MAX_COMBINED_ENTRIES entries, else an error naming `where`."""
        parts = [lexicon for lexicon in lexicons if lexicon.entries]
        if len(parts) == 1:
            return parts[0]  # keeps its compiled matcher
        by_key: dict[tuple[bool, str], LexiconEntry] = {}
        for lexicon in parts:
            for entry in lexicon.entries:
                by_key.pop(entry.match_key, None)  # the later entry takes the later place, too
                by_key[entry.match_key] = entry
        if len(by_key) > MAX_COMBINED_ENTRIES:
            raise invalid(where, f"hold {len(by_key)} entries together; at most {MAX_COMBINED_ENTRIES} are accepted")
        # Each entry was checked in its own lexicon, and no two left match the same texts: checking them again
        # would cost a request a millisecond for every hundred entries.
        combined = object.__new__(cls)
        object.__setattr__(combined, "entries", tuple(by_key.values()))
        return combined

    def apply(self, text: str) -> Substituted:
        """`text` as it is to be said, and the map back to it."""
        hits, end = self._matcher.scan(text, 0, final=True)
        spoken, replacements = _render(text, 0, end, hits, original_offset=0, spoken_offset=0)
        return Substituted(text, spoken, tuple(replacements))

    @functools.cached_property
    def _matcher(self) -> _Matcher:
        # Built on first use: a registered lexicon that no request uses costs only its entries.
        return _Matcher(self.entries)


class StreamingSubstitution:
    """`Lexicon.apply` for text that arrives in fragments: `append` returns the spoken text that no later fragment
    can change, holding back only a tail where a match could still begin, grow or fail its end rules; `close` returns
    the rest. All the returned parts together equal `lexicon.apply(whole text).spoken`."""

    def __init__(self, lexicon: Lexicon) -> None:
        self._matcher = lexicon._matcher
        self._pending = ""  # received and not yet given out
        self._previous = ""  # the last original character given out: the rules at the next position read it
        self._consumed = 0  # original characters given out
        self._original: list[str] = []
        self._spoken: list[str] = []
        self._spoken_length = 0
        self._replacements: list[Replacement] = []
        self._closed = False

    @property
    def pending(self) -> str:
        """The original text held back."""
        return self._pending

    @property
    def closed(self) -> bool:
        return self._closed

    def append(self, fragment: str) -> str:
        if self._closed:
            raise ValueError("the text is already closed")
        self._pending += fragment
        return self._advance(final=False)

    def close(self) -> str:
        """The spoken text of everything held back; "" when already closed."""
        if self._closed:
            return ""
        self._closed = True
        return self._advance(final=True)

    def substituted(self) -> Substituted:
        """The original text given out so far, its spoken text and the map between them."""
        return Substituted("".join(self._original), "".join(self._spoken), tuple(self._replacements))

    def original_span(self, spoken_start: int, spoken_end: int) -> tuple[int, int]:
        """As `Substituted.original_span`, over the spoken text given out so far (offsets from the stream's start)."""
        return _original_span(self._replacements, self._spoken_length, spoken_start, spoken_end)

    def _advance(self, final: bool) -> str:
        text = self._previous + self._pending
        begin = len(self._previous)
        hits, end = self._matcher.scan(text, begin, final)
        if end == begin:
            return ""
        spoken, replacements = _render(text, begin, end, hits, original_offset=self._consumed - begin,
                                       spoken_offset=self._spoken_length)
        self._original.append(text[begin:end])
        self._spoken.append(spoken)
        self._replacements += replacements
        self._consumed += end - begin
        self._spoken_length += len(spoken)
        self._previous = text[end - 1]
        self._pending = text[end:]
        return spoken


@dataclass(frozen=True)
class _Hit:
    start: int
    end: int
    entry: LexiconEntry


class _Undecided:
    """The text ends where the walk still needs to read on."""


_UNDECIDED = _Undecided()


class _Node:
    """A trie node: its edges by folded character (" " stands for a whitespace run), and the entries ending here."""

    __slots__ = ("case_free", "children", "exact", "is_terminal")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.exact: dict[str, LexiconEntry] = {}  # by the grapheme's words, spelled exactly
        self.case_free: LexiconEntry | None = None
        self.is_terminal = False

    def entry_for(self, words: str) -> LexiconEntry | None:
        """The entry that the text's `words` (folded to this node) match, the exact spelling first."""
        return self.exact.get(words, self.case_free) if self.exact else self.case_free


class _Matcher:
    def __init__(self, entries: Sequence[LexiconEntry]) -> None:
        self._root = _Node()
        for entry in entries:
            self._insert(entry)
        self._starts = _starts_pattern(sorted(self._root.children)) if self._root.children else None

    def _insert(self, entry: LexiconEntry) -> None:
        node = self._root
        for character in map(_fold, entry.words):
            node = node.children.setdefault(character, _Node())
        node.is_terminal = True
        if entry.is_case_sensitive:
            node.exact[entry.words] = entry
        else:
            node.case_free = entry

    def scan(self, text: str, begin: int, final: bool) -> tuple[list[_Hit], int]:
        """The matches in text[begin:] (text[:begin] is only read as what precedes it), and the end of the part
        that they are certain for: all of it when `final` (the text ends there), else up to the first position where
        a match could still begin, grow or fail with more text."""
        if self._starts is None:
            return [], len(text)
        folded = _folded(text)
        hits: list[_Hit] = []
        position = begin
        while (candidate := self._starts.search(folded, position)) is not None:
            start = candidate.start()
            outcome = self._longest_at(text, folded, start, final) if _may_start(text, start) else None
            if outcome is _UNDECIDED:
                return hits, start
            if isinstance(outcome, _Hit):
                hits.append(outcome)
                position = outcome.end
            else:
                position = start + 1
        return hits, len(text)

    def _longest_at(self, text: str, folded: str, start: int, final: bool) -> _Hit | _Undecided | None:
        node: _Node | None = self._root
        position, best, length = start, None, len(text)
        while node is not None:
            # Not final, the end of the text decides nothing: a longer match, or a mark or letter after this one,
            # may yet come.
            if position == length and not final:
                return _UNDECIDED
            if node.is_terminal and _may_end(text, position):
                entry = node.entry_for(" ".join(text[start:position].split()))
                best = _Hit(start, position, entry) if entry is not None else best
            if position == length:
                break
            key = folded[position]
            if key.isspace():
                node = node.children.get(" ")
                run = _WHITESPACE_RUN.match(text, position)
                assert run is not None
                position = run.end()
            else:
                node = node.children.get(key)
                position += 1
        return best


def _starts_pattern(first_characters: Sequence[str]) -> re.Pattern[str]:
    """Finds, in C, the next position of the folded text where a grapheme could begin: one of its first characters,
    and for a word character, not right after a letter or digit of a spaced script (`scan` judges the rest)."""
    word = "".join(re.escape(character) for character in first_characters if _is_word(character))
    other = "".join(re.escape(character) for character in first_characters if not _is_word(character))
    alternatives = [f"[{other}]"] if other else []
    if word:
        alternatives.append(f"(?<![^\\W{_SPACELESS_CLASS}])[{word}]")
    return re.compile("|".join(alternatives))


def _check_entry(field: str, entry: LexiconEntry) -> None:
    if not isinstance(entry, LexiconEntry):
        raise invalid(field, f"is a {type(entry).__name__}, not a LexiconEntry")
    _check_text(f"{field}.grapheme", entry.grapheme, MAX_GRAPHEME_CHARS)
    _check_text(f"{field}.alias", entry.alias, MAX_ALIAS_CHARS)
    if unicodedata.category(entry.words[0]).startswith("M"):
        raise invalid(f"{field}.grapheme", "begins with a combining mark, so it could never match")


def _check_text(field: str, value: object, max_chars: int) -> None:
    if not isinstance(value, str):
        raise invalid(field, f"is a {type(value).__name__}, not text")
    if not value.strip():
        raise invalid(field, "is empty")
    if len(value) > max_chars:
        raise invalid(field, f"is {len(value)} characters long; at most {max_chars} are accepted")
    forbidden = next((character for character in value
                      if unicodedata.category(character) in _FORBIDDEN_CATEGORIES), None)
    if forbidden is not None:
        raise invalid(field, f"contains U+{ord(forbidden):04X}, a control character or surrogate")


def _fold(character: str) -> str:
    """The character as case-free matching compares it: its lowercase, where that is one character."""
    lower = character.lower()
    if len(lower) != 1:
        return character
    return "σ" if lower == "ς" else lower


def _folded(text: str) -> str:
    """`_fold` of each character, in one C call where the lowercase text keeps each character's place."""
    lower = text.lower()
    if len(lower) != len(text):
        return "".join(map(_fold, text))
    # str.lower spells a capital sigma by its context (final or not); folding makes both one letter.
    return lower.replace("ς", "σ") if "ς" in lower else lower


@functools.lru_cache(maxsize=4096)
def _is_word(character: str) -> bool:
    if character == "_":
        return True
    if unicodedata.category(character)[0] not in "LMN":
        return False
    code = ord(character)
    index = bisect.bisect_right(_SPACELESS_STARTS, code) - 1
    return index < 0 or code > _SPACELESS_RANGES[index][1]


def _is_mark(character: str) -> bool:
    return unicodedata.category(character)[0] == "M"


def _may_start(text: str, position: int) -> bool:
    character = text[position]
    if _is_mark(character):
        return False
    return position == 0 or not (_is_word(character) and _is_word(text[position - 1]))


def _may_end(text: str, position: int) -> bool:
    if position == len(text):
        return True
    character = text[position]
    if _is_mark(character):
        return False
    return not (_is_word(character) and _is_word(text[position - 1]))


def _render(text: str, begin: int, end: int, hits: list[_Hit], original_offset: int,
            spoken_offset: int) -> tuple[str, list[Replacement]]:
    """text[begin:end] with each hit said as its alias; offsets are shifted to the whole text's."""
    pieces: list[str] = []
    replacements: list[Replacement] = []
    position, spoken_length = begin, spoken_offset
    for hit in hits:
        pieces.append(text[position:hit.start])
        spoken_length += hit.start - position
        alias = _spoken_alias(text, hit)
        pieces.append(alias)
        replacements.append(Replacement(original_offset + hit.start, original_offset + hit.end, spoken_length,
                                        spoken_length + len(alias), hit.entry))
        spoken_length += len(alias)
        position = hit.end
    pieces.append(text[position:end])
    return "".join(pieces), replacements


def _spoken_alias(text: str, hit: _Hit) -> str:
    alias = hit.entry.alias.strip()
    before = " " if hit.start > 0 and _is_word(text[hit.start - 1]) and _is_word(alias[0]) else ""
    after = " " if hit.end < len(text) and _is_word(text[hit.end]) and _is_word(alias[-1]) else ""
    return f"{before}{alias}{after}"


def _original_span(replacements: Sequence[Replacement], spoken_length: int, spoken_start: int,
                   spoken_end: int) -> tuple[int, int]:
    if not 0 <= spoken_start <= spoken_end <= spoken_length:
        raise ValueError(f"[{spoken_start}, {spoken_end}) is not a span of the {spoken_length} spoken characters")
    return (_original_offset(replacements, spoken_start, is_end=False),
            _original_offset(replacements, spoken_end, is_end=True))


def _original_offset(replacements: Sequence[Replacement], offset: int, is_end: bool) -> int:
    """Where `offset` of the spoken text falls in the original: inside an alias, at its grapheme's start (for a
    span's start) or end (for a span's end); elsewhere shifted by the length changes before it."""
    # A span's end touches an alias that starts before it; a start, one that starts at or before it.
    search = bisect.bisect_left if is_end else bisect.bisect_right
    index = search(replacements, offset, key=lambda replacement: replacement.spoken_start) - 1
    if index < 0:
        return offset
    replacement = replacements[index]
    if offset < replacement.spoken_end:
        return replacement.original_end if is_end else replacement.original_start
    return replacement.original_end + offset - replacement.spoken_end
