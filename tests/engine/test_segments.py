"""Long text cut into segments: whole sentences while they fit, then clauses, then words, never inside a word, in
English, Chinese and mixed text, with or without punctuation; the segments always cover the text exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tts_service.model.aligner_text import is_cjk
from tts_service.model.segments import split_segments


def pieces(text: str, max_chars: int) -> list[str]:
    return [segment.of(text) for segment in split_segments(text, max_chars)]


def test_whole_sentences_are_packed_while_they_fit() -> None:
    text = "Hello there. How are you? Fine! And you?"
    assert pieces(text, 30) == ["Hello there. How are you? ", "Fine! And you?"]
    assert pieces(text, 1000) == [text]


def test_chinese_sentences_end_at_their_own_marks() -> None:
    assert pieces("今天天气很好。我们出去玩吧！明天见。", 11) == ["今天天气很好。", "我们出去玩吧！明天见。"]


def test_mixed_text_and_line_breaks_end_sentences() -> None:
    text = "Chapter One\nIt was late。他回家了. The end."
    assert pieces(text, 13) == ["Chapter One\n", "It was late。", "他回家了. ", "The end."]


def test_a_sentence_longer_than_the_budget_is_cut_at_its_clauses_first() -> None:
    text = "When the rain stopped, the streets shone, and everyone came out to walk."
    assert pieces(text, 45) == ["When the rain stopped, the streets shone, ", "and everyone came out to walk."]


def test_text_without_punctuation_is_cut_between_words_never_inside_one() -> None:
    text = "one two three four five six seven eight nine ten eleven twelve"
    cut = pieces(text, 16)
    assert all(len(piece) <= 16 for piece in cut)
    assert [word for piece in cut for word in piece.split()] == text.split()


def test_chinese_without_punctuation_is_cut_between_characters() -> None:
    cut = pieces("这是一个很长的句子没有标点符号一直写下去", 6)
    assert cut == ["这是一个很长", "的句子没有标", "点符号一直写", "下去"]


def test_a_word_longer_than_the_budget_stays_whole_in_a_segment_of_its_own() -> None:
    url = "https://example.com/" + "a" * 60
    assert pieces(f"See {url} now.", 20) == ["See ", f"{url} ", "now."]


def test_punctuation_alone_joins_a_segment_and_text_without_words_has_none() -> None:
    assert pieces("... Hi. !!", 4) == ["... Hi. !!"]
    assert pieces("  ...  ", 10) == []


_TEXT = st.lists(st.sampled_from([*"ab cd.,!?\n你好。，", "xyz", "   "]), max_size=150).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, max_chars=st.integers(min_value=1, max_value=60))
def test_segments_cover_the_text_exactly_and_each_has_words(text: str, max_chars: int) -> None:
    cut = pieces(text, max_chars)
    if not any(character.isalnum() for character in text):
        assert cut == []
        return
    assert "".join(cut) == text
    assert all(any(character.isalnum() for character in piece) for piece in cut)


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, max_chars=st.integers(min_value=1, max_value=60))
def test_no_segment_boundary_falls_inside_a_word(text: str, max_chars: int) -> None:
    offset = 0
    for piece in pieces(text, max_chars)[:-1]:
        offset += len(piece)
        before, after = text[offset - 1], text[offset]
        inside_word = before.isalnum() and after.isalnum() and not (is_cjk(before) or is_cjk(after))
        assert not inside_word, (text, offset)


def test_a_budget_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_chars"):
        split_segments("Hi.", 0)
