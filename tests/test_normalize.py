"""Normalisation: each stage, the switch, and offsets back into the original text."""

import re
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detector import normalize as normalize_module
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


# ---- the linear-time rewrites against the definitions they replace (quadratic, so only on short texts) ----
QUADRATIC_HOMOGLYPH_WORD = re.compile(r"\w*[" + "".join(normalize_module.HOMOGLYPHS) + r"]\w*")
ALPHABET = st.sampled_from(list("ab _.\n-1") + ["é", "о", "а", "Ω", "ο", "Р", "\u0301", "\u0316", "\u0334", "\u05b0",
                                               "가", "\u1100", "\u1161", "\u11a8", "ﬁ", "ｘ", "\u00a0", "\u200b",
                                               "\u0308", "\u0344", "ǅ", "\ufdfa", "\u0f73", "\u0f71", "\u0f72", "ß"])


@settings(max_examples=2000, deadline=None)
@given(st.lists(ALPHABET, max_size=80).map("".join))
def test_the_homoglyph_word_pattern_finds_what_the_quadratic_one_found(text):
    old = [m.span() for m in QUADRATIC_HOMOGLYPH_WORD.finditer(text)]
    assert [m.span() for m in normalize_module._HOMOGLYPH_WORD.finditer(text)] == old


def test_a_combining_sequence_past_the_stream_safe_bound_is_normalised_in_pieces():
    marks = "\u0301\u0316" * 40  # out of canonical order: NFKC sorts them
    result = normalize("a" + marks + " b")
    size = normalize_module.MAX_SEQUENCE
    pieces = [("a" + marks)[i:i + size] for i in range(0, 81, size)]
    assert result.text == "".join(unicodedata.normalize("NFKC", p) for p in pieces) + " b"
    spans = result.original_spans([[i, i + 1] for i in range(len(result.text))])
    assert max(b - a for a, b in spans.tolist()) <= size  # no token's span is the whole sequence


def _apply_edits_per_edit(text, edits):
    """The per-edit form the vectorised ``_apply_edits`` replaced."""
    parts, starts, ends, pos = [], [], [], 0
    for a, b, replacement in edits:
        parts.append(text[pos:a])
        starts += range(pos, a)
        ends += range(pos + 1, a + 1)
        parts.append(replacement)
        starts += [a] * len(replacement)
        ends += [b] * len(replacement)
        pos = b
    parts.append(text[pos:])
    starts += range(pos, len(text))
    ends += range(pos + 1, len(text) + 1)
    return "".join(parts), starts, ends


@settings(max_examples=1000, deadline=None)
@given(st.data())
def test_apply_edits_maps_every_character_as_the_per_edit_form_did(data):
    text = data.draw(st.text(alphabet="abc d", max_size=40))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    edits = [(a, b, data.draw(st.text(alphabet="xy ", max_size=3))) for a, b in zip(cuts[::2], cuts[1::2])]
    folded, starts, ends = normalize_module._apply_edits(text, edits)
    expected = _apply_edits_per_edit(text, edits)
    assert (folded, starts.tolist(), ends.tolist()) == expected


@settings(max_examples=1000, deadline=None)
@given(st.lists(ALPHABET, max_size=60).map("".join))
def test_normalize_is_what_the_quadratic_homoglyph_pattern_gave(text):
    new = normalize(text)
    saved = normalize_module._HOMOGLYPH_WORD
    normalize_module._HOMOGLYPH_WORD = QUADRATIC_HOMOGLYPH_WORD
    try:
        old = normalize(text)
    finally:
        normalize_module._HOMOGLYPH_WORD = saved
    assert (new.text, new.changes) == (old.text, old.changes)
    assert new.original_spans([[i, i + 1] for i in range(len(new.text))]).tolist() == \
        old.original_spans([[i, i + 1] for i in range(len(old.text))]).tolist()
