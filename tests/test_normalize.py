"""Normalisation: each stage, the switch, and offsets back into the original text."""

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detector.normalize import STAGES, normalize


def test_zero_width_and_control_characters_are_removed():
    result = normalize("wa\u200bter\u200d\ufeffmark\u00ad \x07ok")
    assert result.text == "watermark ok"
    assert result.changes == ("invisible",)


def test_nfkc_folds_compatibility_characters():
    result = normalize("ﬁne ｗａｔｅｒ")
    assert result.text == "fine water"
    assert result.changes == ("nfkc",)
    assert result.original_span(0, 2) == (0, 1)  # "fi" both come from the ligature


def test_homoglyphs_fold_in_latin_words_but_russian_text_is_kept():
    assert normalize("pаypаl sеcurity").text == "paypal security"
    russian = "Привет, как дела? Это обычный текст."
    assert normalize(russian).text == russian
    assert normalize("the а cat").text == "the a cat"  # a lone look-alike in mostly Latin text


def test_whitespace_folds_runs_inside_lines_and_line_break_variants_but_keeps_indentation():
    result = normalize("one  two\u2003three\r\n    indented\u2028end")
    assert result.text == "one two three\n    indented\nend"
    assert result.changes == ("nfkc", "whitespace")  # NFKC makes the em space a space
    assert normalize("a\u1680b").changes == ("whitespace",)  # the ogham space survives NFKC


def test_switch_off_and_subsets():
    text = "pаy\u200b  now"
    assert normalize(text, False).text == text and normalize(text, False).changes == ()
    assert normalize(text, ["invisible"]).text == "pаy  now"
    assert normalize(text).changes == ("invisible", "homoglyphs", "whitespace")
    with pytest.raises(ValueError, match="unknown stage"):
        normalize(text, ["unicode"])


def test_offsets_point_into_the_original():
    original = "Ｈｅｌｌｏ\u200b  wоrld\r\nﬁn"
    result = normalize(original)
    assert result.text == "Hello world\nfin"
    pieces = [original[a:b] for a, b in (result.original_span(i, i + 1) for i in range(len(result.text)))]
    assert pieces[:5] == ["Ｈ", "ｅ", "ｌ", "ｌ", "ｏ"]
    assert pieces[5] == "  " and pieces[7] == "о" and pieces[11] == "\r\n" and pieces[12] == "ﬁ"
    assert result.original_span(6, 11) == (8, 13)  # "world" (with its Cyrillic o)
    assert result.original_span(0, len(result.text)) == (0, len(original))


TRICKY = st.sampled_from(list("ab e.\n\t") + ["\u200b", "\u00a0", "\u0301", "ﬁ", "ｘ", "о", "а", "  ", "\r\n",
                                              "\u2028", "\x07", "가", "\u11a8", "é", "Ω", "\ufe0f"])


@settings(max_examples=300, deadline=None)
@given(st.lists(TRICKY, max_size=30).map("".join))
def test_offsets_are_monotone_nonempty_and_in_bounds_and_normalisation_is_idempotent(original):
    result = normalize(original)
    spans = result.original_spans([[i, i + 1] for i in range(len(result.text))])
    for (a, b), (c, _) in zip(spans, spans[1:]):
        assert a <= c
    for a, b in spans:
        assert 0 <= a < b <= len(original)
    assert normalize(result.text).text == result.text
    assert unicodedata.is_normalized("NFKC", result.text) or "nfkc" not in STAGES
