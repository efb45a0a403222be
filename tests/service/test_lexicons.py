"""Pronunciation lexicons: entries checked naming their field, the matching rules of tts_service/api/lexicons.py
one by one, the map from spoken text back to the original, streamed text substituted exactly as the whole, and
registered lexicons kept per owner, durably."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import string
import time
import unicodedata
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tts_service.api import lexicon_store, lexicons
from tts_service.api.errors import ApiError
from tts_service.api.lexicon_store import (
    LexiconLimits,
    LexiconNotFoundError,
    LexiconStore,
    LexiconStoreFullError,
    LexiconStoreUnusableError,
    is_lexicon_id,
)
from tts_service.api.lexicons import (
    MAX_ALIAS_CHARS,
    MAX_ENTRIES,
    MAX_GRAPHEME_CHARS,
    Lexicon,
    LexiconEntry,
    StreamingSubstitution,
    Substituted,
)


def lexicon_of(*pairs: tuple[str, str]) -> Lexicon:
    return Lexicon(tuple(LexiconEntry(grapheme, alias) for grapheme, alias in pairs))


def spoken(text: str, *pairs: tuple[str, str]) -> str:
    return lexicon_of(*pairs).apply(text).spoken


def refusal(*pairs: tuple[str, str], where: str = "lexicon") -> ApiError:
    with pytest.raises(ApiError) as raised:
        Lexicon(tuple(LexiconEntry(grapheme, alias) for grapheme, alias in pairs), where=where)
    assert raised.value.code is grpc.StatusCode.INVALID_ARGUMENT
    return raised.value


def stream(lexicon: Lexicon, fragments: list[str]) -> tuple[str, StreamingSubstitution]:
    substitution = StreamingSubstitution(lexicon)
    parts = [substitution.append(fragment) for fragment in fragments]
    return "".join(parts) + substitution.close(), substitution


def split_at(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(cut, len(text)) for cut in cuts})
    return [text[start:end] for start, end in zip([0, *points], [*points, len(text)], strict=True)]


# ---- entries checked on construction -------------------------------------------------------------------------------

def test_an_empty_grapheme_is_refused_naming_its_index() -> None:
    error = refusal(("SQL", "sequel"), ("  ", "nothing"))
    assert error.field == "lexicon.entries[1].grapheme"
    assert error.message == "lexicon.entries[1].grapheme: is empty"


def test_an_empty_or_blank_alias_is_refused() -> None:
    assert refusal(("SQL", "")).field == "lexicon.entries[0].alias"
    assert refusal(("SQL", " \u3000 ")).field == "lexicon.entries[0].alias"


def test_graphemes_and_aliases_longer_than_their_limits_are_refused_and_the_limits_themselves_accepted() -> None:
    lexicon_of(("g" * MAX_GRAPHEME_CHARS, "a" * MAX_ALIAS_CHARS))
    error = refusal(("g" * (MAX_GRAPHEME_CHARS + 1), "alias"))
    assert error.field == "lexicon.entries[0].grapheme"
    assert f"at most {MAX_GRAPHEME_CHARS}" in error.message
    error = refusal(("g", "a" * (MAX_ALIAS_CHARS + 1)))
    assert error.field == "lexicon.entries[0].alias"
    assert f"at most {MAX_ALIAS_CHARS}" in error.message


@pytest.mark.parametrize(("grapheme", "alias", "field"), [
    ("SQL\x07", "sequel", "grapheme"), ("New\nYork", "NYC", "grapheme"), ("SQL", "se\nquel", "alias"),
    ("SQL", "sequel\x00", "alias"), ("\ud800", "surrogate", "grapheme")])
def test_control_characters_and_surrogates_are_refused(grapheme: str, alias: str, field: str) -> None:
    error = refusal(("ok", "fine"), (grapheme, alias))
    assert error.field == f"lexicon.entries[1].{field}"
    assert "control character" in error.message


def test_more_entries_than_the_limit_are_refused_naming_the_limit() -> None:
    Lexicon(tuple(LexiconEntry(f"w{index}", "x") for index in range(MAX_ENTRIES)))
    error = refusal(*((f"w{index}", "x") for index in range(MAX_ENTRIES + 1)))
    assert error.field == "lexicon.entries"
    assert f"at most {MAX_ENTRIES}" in error.message


def test_a_grapheme_given_twice_under_the_case_rule_is_refused_naming_both_indexes() -> None:
    error = refusal(("SQL", "sequel"), ("Qwen", "chwen"), ("sql", "ess cue ell"), (" SQL ", "again"))
    assert error.field == "lexicon.entries[3].grapheme"
    assert "lexicon.entries[0].grapheme" in error.message
    assert refusal(("new york", "a"), ("new \t york", "b")).field == "lexicon.entries[1].grapheme"


def test_an_exact_case_grapheme_and_its_case_free_spelling_may_stand_together() -> None:
    assert len(lexicon_of(("US", "United States"), ("us", "us"), ("Us", "Uss")).entries) == 3


def test_errors_name_the_field_the_caller_gives() -> None:
    assert refusal(("", "x"), where="pronunciations").field == "pronunciations.entries[0].grapheme"


def test_a_grapheme_beginning_with_a_combining_mark_is_refused_as_it_could_never_match() -> None:
    assert refusal(("\u0301e", "x")).field == "lexicon.entries[0].grapheme"


def test_an_entry_that_is_not_an_entry_is_refused() -> None:
    with pytest.raises(ApiError) as raised:
        Lexicon((("SQL", "sequel"),))  # type: ignore[arg-type]
    assert raised.value.field == "lexicon.entries[0]"


# ---- matching -------------------------------------------------------------------------------------------------------

def test_a_lowercase_grapheme_matches_any_case() -> None:
    assert spoken("sql, SQL, Sql and sQl", ("sql", "sequel")) == "sequel, sequel, sequel and sequel"


def test_an_uppercase_grapheme_matches_only_its_own_case() -> None:
    assert spoken("US troops, us, Us", ("US", "United States")) == "United States troops, us, Us"
    assert spoken("Qwen qwen QWEN", ("Qwen", "chwen")) == "chwen qwen QWEN"


def test_an_exact_case_grapheme_wins_over_a_case_free_one_on_the_same_text() -> None:
    pairs = (("sql", "ess cue ell"), ("SQL", "sequel"))
    assert spoken("SQL and sql and Sql", *pairs) == "sequel and ess cue ell and ess cue ell"


def test_case_free_greek_matches_a_final_sigma_in_capitals() -> None:
    assert spoken("ΟΔΟΣ, οδος", ("οδος", "street")) == "street, street"


@pytest.mark.parametrize("text", ["MySQL", "SQLite", "SQL_table", "SQL2", "ASQL", "2SQL", "éSQL"])
def test_a_grapheme_never_matches_inside_a_word(text: str) -> None:
    assert spoken(text, ("SQL", "sequel")) == text


@pytest.mark.parametrize(("text", "expected"), [
    ("SQL", "sequel"), ("(SQL)", "(sequel)"), ("SQL's", "sequel's"), ("SQL-based", "sequel-based"),
    ("SQL.", "sequel."), ("\tSQL\n", "\tsequel\n"), ("«SQL»", "«sequel»")])
def test_a_grapheme_matches_a_whole_word_between_any_non_word_characters(text: str, expected: str) -> None:
    assert spoken(text, ("SQL", "sequel")) == expected


def test_a_grapheme_ending_in_punctuation_needs_no_boundary_after_it() -> None:
    pairs = (("e.g.", "for example"),)
    assert spoken("e.g., this; e.g.that", *pairs) == "for example, this; for example that"
    assert spoken("the.g. one", *pairs) == "the.g. one"  # its first letter is still a word's start


def test_a_grapheme_of_punctuation_matches_inside_a_word_and_its_alias_stays_a_word_of_its_own() -> None:
    assert spoken("R&D & more", ("&", "and")) == "R and D and more"
    assert spoken("C++ and C++11", ("C++", "C plus plus")) == "C plus plus and C plus plus 11"


def test_cjk_graphemes_match_anywhere_since_each_character_is_a_word() -> None:
    assert spoken("这个数据库很好", ("数据库", "shùjùkù")) == "这个shùjùkù很好"
    assert spoken("東京都に行く", ("東京", "とうきょう")) == "とうきょう都に行く"
    assert spoken("카카오에서", ("카카오", "kakao")) == "kakao에서"


def test_a_latin_grapheme_matches_beside_cjk_and_its_alias_is_spaced_only_from_latin_words() -> None:
    assert spoken("用SQL查询", ("SQL", "sequel")) == "用sequel查询"
    assert spoken("SQL数据库", ("数据库", "database")) == "SQL database"


def test_a_match_never_cuts_a_letter_from_its_combining_mark() -> None:
    assert spoken("cafe\u0301 cafe", ("cafe", "coffee")) == "cafe\u0301 coffee"
    assert spoken("ที่นี่", ("ท", "t")) == "ที่นี่"  # a Thai consonant with its tone and vowel marks


def test_a_multi_word_grapheme_matches_any_whitespace_run_between_its_words() -> None:
    pairs = (("New York", "N Y C"),)
    assert spoken("New York, new\n\t york, NEW  YORK", ("new york", "N Y C")) == "N Y C, N Y C, N Y C"
    assert spoken("NewYork, New-York, New York", *pairs) == "NewYork, New-York, N Y C"
    assert spoken("New York's Yorker", *pairs) == "N Y C's Yorker"


def test_whitespace_around_a_grapheme_or_an_alias_is_ignored() -> None:
    assert spoken("I like SQL.", ("  SQL ", "  sequel ")) == "I like sequel."


def test_the_longest_match_wins_at_a_position() -> None:
    pairs = (("New", "Neu"), ("New York City", "N Y C"), ("New York", "N Y"))
    assert spoken("New York City, New York, New Jersey", *pairs) == "N Y C, N Y, Neu Jersey"


def test_a_longer_grapheme_that_fails_its_end_rule_leaves_the_shorter_one() -> None:
    assert spoken("New Yorker", ("New", "Neu"), ("New York", "N Y")) == "Neu Yorker"


def test_the_leftmost_match_wins_over_an_overlapping_longer_one() -> None:
    pairs = (("New York", "N Y"), ("York City Hall", "the hall"))
    assert spoken("New York City Hall", *pairs) == "N Y City Hall"


def test_an_alias_is_never_matched_again() -> None:
    assert spoken("SQL sequel", ("SQL", "sequel"), ("sequel", "the film")) == "sequel the film"
    assert spoken("aa", ("a", "a a")) == "aa"
    assert spoken("a b", ("a", "b"), ("b", "a")) == "b a"


def test_a_text_without_matches_and_an_empty_lexicon_change_nothing() -> None:
    result = lexicon_of(("SQL", "sequel")).apply("nothing here")
    assert (result.spoken, result.replacements) == ("nothing here", ())
    assert Lexicon().apply("SQL").spoken == "SQL"
    assert Lexicon().apply("").spoken == ""


# ---- the map back to the original -----------------------------------------------------------------------------------

def spoken_words(result: Substituted) -> list[tuple[str, str]]:
    """Each word of the spoken text, with the original text its span maps to."""
    return [(word.group(), result.original[slice(*result.original_span(word.start(), word.end()))])
            for word in re.finditer(r"\S+", result.spoken)]


def test_each_word_of_an_alias_maps_to_the_whole_grapheme() -> None:
    result = lexicon_of(("e.g.", "for example"), ("SQL", "sequel")).apply("Say e.g. SQL now")
    assert result.spoken == "Say for example sequel now"
    assert spoken_words(result) == [("Say", "Say"), ("for", "e.g."), ("example", "e.g."), ("sequel", "SQL"),
                                    ("now", "now")]


def test_text_outside_the_matches_maps_one_to_one() -> None:
    result = lexicon_of(("NY", "New York")).apply("From NY to Boston")
    start = result.spoken.index("Boston")
    assert result.spoken == "From New York to Boston"
    assert result.original_span(start, start + 6) == (11, 17)
    assert result.original_span(0, 4) == (0, 4)


def test_a_span_touching_an_alias_covers_its_whole_grapheme() -> None:
    result = lexicon_of(("e.g.", "for example")).apply("x e.g. y")
    assert result.spoken == "x for example y"
    assert result.original_span(0, 3) == (0, 6)  # "x f" ends inside the alias
    assert result.original_span(6, 15) == (2, 8)  # "example y" begins inside it
    assert result.original_span(2, 2) == (2, 2)  # right before the alias
    assert result.original_span(3, 3) == (2, 6)  # inside it
    assert result.original_span(13, 13) == (6, 6)  # right after the alias


def test_a_padded_alias_maps_to_its_grapheme_and_its_neighbours_to_themselves() -> None:
    result = lexicon_of(("&", "and")).apply("R&D")
    assert spoken_words(result) == [("R", "R"), ("and", "&"), ("D", "D")]


def test_a_span_outside_the_spoken_text_is_refused() -> None:
    result = lexicon_of(("SQL", "sequel")).apply("SQL")
    for span in ((-1, 2), (3, 2), (0, 7)):
        with pytest.raises(ValueError):
            result.original_span(*span)


# ---- a plain reading of the rules, and the properties -------------------------------------------------------------

RULE_PAIRS = (("SQL", "sequel"), ("sql", "ess cue ell"), ("e.g.", "for example"), ("New York", "N Y"),
              ("york", "yorrk"), ("new", "neu"), ("&", "and"), ("数据", "data"), ("数据库", "database"),
              ("US", "United States"), ("a b", "ab"), ("aa", "double a"), ("Q", "queue"), ("b.", "bee"))
PIECES = ["SQL", "sql", "Sql", "e.g.", "e", ".", "g", "New", "new", "York", "york", "&", "数", "据", "库", "US",
          "us", "a", "b", "aa", "Q", " ", "  ", "\n", ",", "x", "_", "1", "\u0301", "'", "-", "S", "QL"]


def plain_is_word(character: str) -> bool:
    is_cjk = "\u4e00" <= character <= "\u9fff"
    return (character.isalnum() or character == "_" or unicodedata.category(character)[0] == "M") and not is_cjk


def plain_boundary(text: str, position: int) -> bool:
    """No match may begin or end here: it would cut a letter from its mark or split a word."""
    if position in (0, len(text)):
        return True
    if unicodedata.category(text[position])[0] == "M":
        return False
    return not (plain_is_word(text[position - 1]) and plain_is_word(text[position]))


def plain_apply(text: str, pairs: tuple[tuple[str, str], ...]) -> tuple[str, list[tuple[int, int]]]:
    """The rules read literally: one regular expression per entry, tried at every position."""
    patterns = [(re.compile(r"\s+".join(map(re.escape, grapheme.split())),
                            0 if grapheme != grapheme.lower() else re.IGNORECASE), grapheme != grapheme.lower(), alias)
                for grapheme, alias in pairs]
    out, spans, position = [], [], 0
    while position < len(text):
        found = [(match.end(), is_exact, alias) for pattern, is_exact, alias in patterns
                 if (match := pattern.match(text, position)) and plain_boundary(text, position)
                 and plain_boundary(text, match.end())]
        if not found:
            out.append(text[position])
            position += 1
            continue
        end, _, alias = max(found, key=lambda hit: (hit[0], hit[1]))
        before = " " if position > 0 and plain_is_word(text[position - 1]) and plain_is_word(alias[0]) else ""
        after = " " if end < len(text) and plain_is_word(text[end]) and plain_is_word(alias[-1]) else ""
        out.append(before + alias + after)
        spans.append((position, end))
        position = end
    return "".join(out), spans


texts = st.lists(st.sampled_from(PIECES), max_size=24).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=texts)
def test_apply_agrees_with_a_plain_reading_of_the_rules(text: str) -> None:
    result = lexicon_of(*RULE_PAIRS).apply(text)
    expected_spoken, expected_spans = plain_apply(text, RULE_PAIRS)
    assert result.spoken == expected_spoken
    assert [(item.original_start, item.original_end) for item in result.replacements] == expected_spans


@settings(max_examples=400, deadline=None)
@given(text=texts, cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=12))
def test_streamed_fragments_split_anywhere_give_the_whole_texts_substitution(text: str, cuts: list[int]) -> None:
    lexicon = lexicon_of(*RULE_PAIRS)
    whole = lexicon.apply(text)
    streamed, substitution = stream(lexicon, split_at(text, cuts))
    assert streamed == whole.spoken
    assert substitution.substituted() == whole


@settings(max_examples=200, deadline=None)
@given(text=texts)
def test_the_map_takes_text_between_aliases_one_to_one_and_each_alias_to_its_grapheme(text: str) -> None:
    result = lexicon_of(*RULE_PAIRS).apply(text)
    spoken_end = original_end = 0
    for item in result.replacements:
        assert result.spoken[spoken_end:item.spoken_start] == result.original[original_end:item.original_start]
        assert result.original_span(item.spoken_start, item.spoken_end) == (item.original_start, item.original_end)
        spoken_end, original_end = item.spoken_end, item.original_end
    assert result.spoken[spoken_end:] == result.original[original_end:]
    for start in range(len(result.spoken) + 1):
        original_start, _ = result.original_span(start, start)
        assert 0 <= original_start <= len(result.original)


# ---- streaming ------------------------------------------------------------------------------------------------------

def test_streaming_holds_back_only_a_tail_that_could_still_become_a_match() -> None:
    substitution = StreamingSubstitution(lexicon_of(("SQL", "sequel"), ("New York", "N Y")))
    assert substitution.append("I like S") == "I like "
    assert substitution.pending == "S"
    assert substitution.append("Q") == ""
    assert substitution.append("L and Sw") == "sequel and Sw"  # "Sw" begins no grapheme
    assert substitution.append("ift in New") == "ift in "
    assert substitution.append(" ") == ""
    assert substitution.pending == "New "
    assert substitution.append("Jersey") == "New Jersey"
    assert substitution.close() == ""


def test_streaming_holds_a_whole_match_until_the_next_character_decides_it() -> None:
    lexicon = lexicon_of(("SQL", "sequel"))
    for fragments, expected in ((["SQL", "ite"], "SQLite"), (["SQL", " db"], "sequel db"), (["SQL"], "sequel"),
                                (["SQL", "\u0301"], "SQL\u0301")):
        substitution = StreamingSubstitution(lexicon)
        assert substitution.append(fragments[0]) == ""
        assert "".join(substitution.append(fragment) for fragment in fragments[1:]) + substitution.close() == expected


def test_streaming_without_a_lexicon_gives_out_everything_at_once() -> None:
    substitution = StreamingSubstitution(Lexicon())
    assert substitution.append("SQL and") == "SQL and"
    assert substitution.pending == ""


def test_a_closed_stream_takes_no_more_text() -> None:
    substitution = StreamingSubstitution(lexicon_of(("SQL", "sequel")))
    substitution.append("SQ")
    assert substitution.close() == "SQ"
    assert substitution.closed
    assert substitution.close() == ""
    with pytest.raises(ValueError):
        substitution.append("L")


def test_the_streams_map_covers_the_text_given_out_so_far() -> None:
    substitution = StreamingSubstitution(lexicon_of(("e.g.", "for example")))
    given_out = substitution.append("Say e.g. this and e.g")
    assert given_out == "Say for example this and "
    assert substitution.original_span(4, 7) == (4, 8)
    assert substitution.original_span(16, 20) == (9, 13)
    given_out += substitution.append(". that") + substitution.close()
    assert given_out == "Say for example this and for example that"
    assert substitution.original_span(given_out.rindex("example"), len(given_out) - 5) == (18, 22)
    assert substitution.substituted().original == "Say e.g. this and e.g. that"


def test_character_by_character_text_gives_the_whole_texts_substitution() -> None:
    lexicon = lexicon_of(*RULE_PAIRS)
    text = "Use SQL, e.g. in New \n York & 数据库 — US sql, a  b aa. b."
    assert stream(lexicon, list(text))[0] == lexicon.apply(text).spoken


# ---- combining lexicons ---------------------------------------------------------------------------------------------

def test_a_later_lexicon_wins_a_conflict_when_combined() -> None:
    registered = lexicon_of(("SQL", "sequel"), ("Qwen", "chwen"))
    request = lexicon_of(("SQL", "ess cue ell"), ("sql", "lower"))
    combined = Lexicon.combined([registered, request])
    assert combined.apply("SQL Qwen sql").spoken == "ess cue ell chwen lower"
    assert Lexicon.combined([request, registered]).apply("SQL").spoken == "sequel"
    assert len(combined.entries) == 3


def test_combining_one_lexicon_gives_that_lexicon_and_none_an_empty_one() -> None:
    only = lexicon_of(("SQL", "sequel"))
    assert Lexicon.combined([Lexicon(), only]) is only
    assert Lexicon.combined([]).entries == ()


def test_combined_lexicons_are_limited_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lexicons, "MAX_COMBINED_ENTRIES", 3)
    two = lexicon_of(("a", "x"), ("b", "y"))
    assert len(Lexicon.combined([two, lexicon_of(("a", "z"))]).entries) == 2
    with pytest.raises(ApiError) as raised:
        Lexicon.combined([two, lexicon_of(("c", "z"), ("d", "w"))], where="lexicon_ids")
    assert raised.value.message == "lexicon_ids: hold 4 entries together; at most 3 are accepted"


# ---- speed ----------------------------------------------------------------------------------------------------------

def test_a_long_text_with_a_full_lexicon_is_substituted_in_one_pass() -> None:
    generator = random.Random(7)
    graphemes: set[str] = set()
    while len(graphemes) < MAX_ENTRIES:
        graphemes.add("".join(generator.choices(string.ascii_lowercase, k=generator.randint(2, 9))))
    ordered = sorted(graphemes)
    lexicon = Lexicon(tuple(LexiconEntry(grapheme if index % 3 else grapheme.upper(), f"say {grapheme}")
                            for index, grapheme in enumerate(ordered)))
    words = [generator.choice(ordered) if generator.random() < 0.2 else
             "".join(generator.choices(string.ascii_letters, k=generator.randint(1, 10))) for _ in range(40_000)]
    text = " ".join(words)[:200_000]
    started = time.perf_counter()
    result = lexicon.apply(text)
    elapsed = time.perf_counter() - started
    assert len(result.replacements) > 1_000
    # About 0.2 s on one slow core: a scan of the text per entry would take minutes in Python, seconds in C.
    assert elapsed < 3.0, elapsed


# ---- the registry ---------------------------------------------------------------------------------------------------

SQL = lexicon_of(("SQL", "sequel"))


def test_a_registered_lexicon_is_got_and_listed_by_its_owner() -> None:
    store = LexiconStore.open(None)
    lexicon_id = store.create("alice", SQL)
    registered = store.get("alice", lexicon_id)
    assert (registered.lexicon_id, registered.owner, registered.lexicon) == (lexicon_id, "alice", SQL)
    second = store.create("alice", lexicon_of(("Qwen", "chwen")))
    assert [item.lexicon_id for item in store.list("alice")] == [lexicon_id, second]


def test_lexicon_ids_are_prefixed_url_safe_and_random() -> None:
    store = LexiconStore.open(None, LexiconLimits(max_lexicons=200, max_lexicons_per_owner=200))
    ids = {store.create("alice", SQL) for _ in range(100)}
    assert len(ids) == 100
    assert all(lexicon_id.startswith("lex_") and is_lexicon_id(lexicon_id) for lexicon_id in ids)
    assert all(re.fullmatch(r"lex_[A-Za-z0-9_-]{22}", lexicon_id) for lexicon_id in ids)


def test_an_owner_never_sees_another_owners_lexicon() -> None:
    store = LexiconStore.open(None)
    lexicon_id = store.create("alice", SQL)
    with pytest.raises(LexiconNotFoundError) as other_owner:
        store.get("mallory", lexicon_id)
    with pytest.raises(LexiconNotFoundError) as absent:
        store.get("mallory", "lex_" + "A" * 22)
    assert other_owner.value.code is absent.value.code is grpc.StatusCode.NOT_FOUND
    assert other_owner.value.message == f"lexicon_id: no lexicon {lexicon_id!r}"
    assert store.list("mallory") == ()
    with pytest.raises(LexiconNotFoundError):
        store.delete("mallory", lexicon_id)
    assert store.get("alice", lexicon_id).lexicon == SQL


def test_a_lookup_names_the_field_the_caller_gives() -> None:
    with pytest.raises(LexiconNotFoundError) as raised:
        LexiconStore.open(None).get("alice", "../../etc/passwd", field="lexicon_ids[2]")
    assert raised.value.field == "lexicon_ids[2]"


def test_a_deleted_lexicon_is_gone() -> None:
    store = LexiconStore.open(None)
    lexicon_id = store.create("alice", SQL)
    store.delete("alice", lexicon_id)
    with pytest.raises(LexiconNotFoundError):
        store.get("alice", lexicon_id)
    with pytest.raises(LexiconNotFoundError):
        store.delete("alice", lexicon_id)


def test_an_empty_lexicon_cannot_be_registered() -> None:
    with pytest.raises(ApiError) as raised:
        LexiconStore.open(None).create("alice", Lexicon())
    assert raised.value.field == "lexicon.entries"


def test_the_store_refuses_past_its_limits_naming_them() -> None:
    store = LexiconStore.open(None, LexiconLimits(max_lexicons=3, max_lexicons_per_owner=2))
    store.create("alice", SQL)
    store.create("alice", SQL)
    with pytest.raises(LexiconStoreFullError) as per_owner:
        store.create("alice", SQL)
    assert per_owner.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "2 lexicons, the most one caller may keep" in per_owner.value.message
    store.create("bob", SQL)
    with pytest.raises(LexiconStoreFullError) as in_all:
        store.create("carol", SQL)
    assert "already stores 3 lexicons, the most it keeps" in in_all.value.message


def test_registered_lexicons_outlive_a_reopen(tmp_path: Path) -> None:
    store = LexiconStore.open(tmp_path)
    lexicon = lexicon_of(("SQL", "sequel"), ("数据库", "database"), ("New  York", " N Y "))
    kept, deleted = store.create("alice", lexicon), store.create("bob", SQL)
    store.delete("bob", deleted)
    reopened = LexiconStore.open(tmp_path)
    assert reopened.is_persistent
    registered = reopened.get("alice", kept)
    assert registered.lexicon == lexicon
    assert registered.created_at == store.get("alice", kept).created_at
    assert reopened.list("bob") == ()
    assert sorted(os.listdir(tmp_path)) == [f"{kept}.json"]  # no temporary file left behind


def test_a_reopened_store_keeps_counting_toward_its_limits(tmp_path: Path) -> None:
    LexiconStore.open(tmp_path).create("alice", SQL)
    with pytest.raises(LexiconStoreFullError):
        LexiconStore.open(tmp_path, LexiconLimits(max_lexicons=1)).create("bob", SQL)


def test_unusable_files_are_reported_once_and_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = LexiconStore.open(tmp_path)
    good = store.create("alice", SQL)
    document = json.loads((tmp_path / f"{good}.json").read_text())
    bad = {name: "lex_" + name.ljust(22, "x") for name in ("cut", "otherid", "badentry", "link", "fifo", "folder",
                                                            "big")}
    (tmp_path / f"{bad['cut']}.json").write_bytes((tmp_path / f"{good}.json").read_bytes()[:-9])
    (tmp_path / f"{bad['otherid']}.json").write_text(json.dumps(document))
    (tmp_path / f"{bad['badentry']}.json").write_text(json.dumps(
        {**document, "lexicon_id": bad["badentry"], "entries": [{"grapheme": "", "alias": "x"}]}))
    (tmp_path / f"{bad['link']}.json").symlink_to(tmp_path / f"{good}.json")
    os.mkfifo(tmp_path / f"{bad['fifo']}.json")
    (tmp_path / f"{bad['folder']}.json").mkdir()
    (tmp_path / f"{bad['big']}.json").write_bytes(b" " * (lexicon_store.MAX_FILE_BYTES + 1))
    (tmp_path / "notes.txt").write_text("not a lexicon")
    with caplog.at_level(logging.WARNING, logger="tts_service.api.lexicon_store"):
        reopened = LexiconStore.open(tmp_path)
    assert [item.lexicon_id for item in reopened.list("alice")] == [good]
    reported = [record.getMessage() for record in caplog.records]
    assert len(reported) == len(bad) + 1
    for name, reason in (("cut", "not JSON"), ("otherid", f"not {bad['otherid']!r}"),
                         ("badentry", "lexicon.entries[0].grapheme: is empty"), ("link", "a symbolic link"),
                         ("fifo", "not a regular file"), ("folder", "not a regular file"), ("big", "larger than")):
        assert any(bad[name] in message and reason in message for message in reported), name
    assert any("notes.txt" in message for message in reported)
    for lexicon_id in bad.values():
        with pytest.raises(LexiconNotFoundError):
            reopened.get("alice", lexicon_id)


def test_a_write_that_never_finished_is_removed_at_open(tmp_path: Path) -> None:
    abandoned, recent = tmp_path / ".tmp-abandoned", tmp_path / ".tmp-recent"
    abandoned.write_text("{")
    recent.write_text("{")
    long_ago = time.time() - 3600
    os.utime(abandoned, (long_ago, long_ago))
    LexiconStore.open(tmp_path)
    assert not abandoned.exists()
    assert recent.exists()


def test_a_directory_that_cannot_be_made_is_reported_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(LexiconStoreUnusableError, match="file"):
        LexiconStore.open(blocker / "lexicons")
