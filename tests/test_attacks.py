"""Attacks: rate 0 is the identity, every attack is seeded and reproducible, each edits what it says
at the rate it says; the normaliser undoes the character tricks; the model-driven attacks on tiny inputs."""

from collections import Counter

import pytest

from detector.normalize import normalize
from evaluation.attack_context import AttackContext
from evaluation.attacks import (
    ATTACK_NAMES,
    ATTACKS,
    FAST_ATTACKS,
    get_attack,
    typo,
)
from evaluation.attacks_model import clean_paraphrase
from evaluation.corpus import (
    load_documents,
    prompt_documents,
    sentence_spans,
    split_first_sentence,
)
from watermark.vocab import load_vocabulary

TEXTS = [
    ("The council approved the new budget on Tuesday after a long debate. Residents said the plan would "
     "fund two schools and a bridge across the river, which has been closed since the floods last year."),
    ("Firefighters worked through the night to contain a blaze near the highway. Officials warned that "
     "strong winds could push the fire towards homes, and asked people in nearby towns to be ready to leave."),
]


@pytest.fixture(scope="module")
def context():
    vocab = load_vocabulary()
    return AttackContext(vocab.tokenizer, human_texts=[d.body for d in load_documents()[:20]])


def tokens(context, text):
    return context.encode(text)


@pytest.mark.parametrize("name", FAST_ATTACKS)
def test_rate_zero_is_identity_and_attacks_are_reproducible(context, name):
    attack = get_attack(name)
    assert attack.apply(TEXTS, 0.0, 7, context) == TEXTS
    first = attack.apply(TEXTS, 0.3, 7, context)
    assert first == attack.apply(TEXTS, 0.3, 7, context)  # same seed: same edits
    assert first != TEXTS
    if name != "truncation":  # the one attack without randomness
        assert attack.apply(TEXTS, 0.3, 8, context) != first  # another seed: other edits
    # each text has its own generator: attacking one text alone gives the same result for it
    assert attack.apply(TEXTS[:1], 0.3, 7, context) == first[:1]


def test_token_delete_and_insert_change_the_count_by_the_rate(context):
    for text in TEXTS:
        count = len(tokens(context, text))
        edits = round(0.2 * count)
        deleted = len(tokens(context, get_attack("token-delete").apply([text], 0.2, 1, context)[0]))
        inserted = len(tokens(context, get_attack("token-insert").apply([text], 0.2, 1, context)[0]))
        # decoding and re-tokenising may merge or split a few pieces at the edit points
        assert abs(deleted - (count - edits)) <= 0.25 * edits
        assert abs(inserted - (count + edits)) <= 0.5 * edits


def test_swap_moves_tokens_without_changing_the_characters(context):
    for text in TEXTS:
        swapped = get_attack("token-swap").apply([text], 0.5, 3, context)[0]
        assert swapped != text
        assert Counter(swapped) == Counter(text)


def test_truncation_keeps_the_first_tokens(context):
    for text in TEXTS:
        ids = tokens(context, text)
        cut = get_attack("truncation").apply([text], 0.25, 0, context)[0]
        assert text.startswith(cut)
        assert len(tokens(context, cut)) == round(0.75 * len(ids))


def test_dilution_embeds_the_text_as_the_given_fraction(context):
    for text in TEXTS:
        diluted = get_attack("dilution").apply([text], 0.75, 0, context)[0]
        assert text in diluted
        fraction = len(text.split()) / len(diluted.split())
        assert fraction == pytest.approx(0.25, abs=0.02)
    with pytest.raises(ValueError, match="rate"):
        get_attack("dilution").apply(TEXTS, 1.0, 0, context)


def test_word_edits_keep_the_word_count_and_case_edits_only_change_case(context):
    for text in TEXTS:
        cased = get_attack("word-case").apply([text], 0.5, 0, context)[0]
        assert cased.lower() == text.lower() and cased != text
        typos = get_attack("word-typo").apply([text], 0.5, 0, context)[0]
        assert len(typos.split()) == len(text.split())
        changed = sum(a != b for a, b in zip(typos.split(), text.split()))
        words = len(text.split())
        assert 0.3 * words <= changed <= 0.5 * words + 1  # a typo can leave a word unchanged ("ll" doubled -> swap no-op)


def test_typo_changes_the_word():
    import random

    rng = random.Random(0)
    assert sum(typo("bridge", rng) != "bridge" for _ in range(50)) >= 45


@pytest.mark.parametrize("name", ["homoglyph", "zero-width"])
def test_character_tricks_change_the_text_and_the_normaliser_undoes_them(context, name):
    for rate in (0.1, 0.5, 1.0):
        attacked = get_attack(name).apply(TEXTS, rate, 0, context)
        for original, edited in zip(TEXTS, attacked):
            assert edited != original
            assert context.encode(edited) != context.encode(original)  # the attack does move token ids
            assert normalize(edited).text == normalize(original).text


def test_homoglyph_rate_is_the_fraction_of_replaceable_letters(context):
    from evaluation.attacks import LOOKALIKES

    text = TEXTS[0]
    replaceable = sum(ch in LOOKALIKES for ch in text)
    edited = get_attack("homoglyph").apply([text], 0.4, 0, context)[0]
    assert sum(a != b for a, b in zip(edited, text)) == round(0.4 * replaceable)


def test_unknown_attack_and_bad_rates_name_the_problem(context):
    with pytest.raises(ValueError, match="unknown 'nope'.*token-delete"):
        get_attack("nope")
    with pytest.raises(ValueError, match="rate"):
        get_attack("token-delete").apply(TEXTS, 1.5, 0, context)
    with pytest.raises(ValueError, match="rate"):
        get_attack("token-delete").apply(TEXTS, -0.1, 0, context)
    assert set(ATTACK_NAMES) >= {"token-delete", "token-insert", "token-substitute", "token-substitute-lm",
                                 "token-swap", "word-lm", "word-typo", "word-case", "homoglyph", "zero-width",
                                 "dilution", "paraphrase", "truncation"}
    assert all(not ATTACKS[n].needs_model for n in FAST_ATTACKS)


def test_model_attacks_refuse_without_a_model(context):
    for name in ("token-substitute-lm", "word-lm", "paraphrase"):
        with pytest.raises(ValueError, match="needs AttackContext"):
            get_attack(name).apply(TEXTS, 0.5, 0, context)


def test_clean_paraphrase_takes_the_sentence_from_a_chat_reply():
    assert clean_paraphrase('Sure! Here is the rewritten sentence: "The cat sat."\n\nHope it helps.') == "The cat sat."
    assert clean_paraphrase("  The dog ran.  ") == "The dog ran."
    assert clean_paraphrase("") == ""


def test_corpus_sentences_and_prompts():
    assert split_first_sentence("Mr. Howard spoke on Monday. He left.") == ("Mr. Howard spoke on Monday.", "He left.")
    text = 'He said "Go now." Then U.S. troops left! Why? OK'
    assert [text[a:b] for a, b in sentence_spans(text)] == ['He said "Go now."', "Then U.S. troops left!", "Why?", "OK"]
    docs = prompt_documents(10)
    assert len(docs) == 10 and all(d.first_sentence and len(d.body.split()) >= 40 for d in docs)
    assert docs == prompt_documents(10)
    with pytest.raises(ValueError, match="n:"):
        prompt_documents(10_000)


# --------------------------------------------------------------------------- model-driven attacks (tiny)
@pytest.fixture(scope="module")
def model_context(context):
    from evaluation.lm import TeacherForcedLM
    from generation.engine import Engine
    from generation.models import load_model

    loaded = load_model()
    return AttackContext(context.tokenizer, human_texts=context.human_texts, lm=TeacherForcedLM(loaded),
                         engine=Engine(loaded, max_num_seqs=4, max_model_len=512))


@pytest.mark.slow
def test_model_proposed_token_substitution(model_context):
    attacked = get_attack("token-substitute-lm").apply(TEXTS, 0.3, 0, model_context)
    assert attacked == get_attack("token-substitute-lm").apply(TEXTS, 0.3, 0, model_context)
    for original, edited in zip(TEXTS, attacked):
        a, b = model_context.encode(original), model_context.encode(edited)
        changed = sum(x != y for x, y in zip(a, b)) if len(a) == len(b) else None
        assert edited != original
        if changed is not None:  # same length after re-tokenising: count the substitutions
            assert changed <= round(0.3 * (len(a) - 1)) + 2


@pytest.mark.slow
def test_model_proposed_word_replacement(model_context):
    attacked = get_attack("word-lm").apply(TEXTS, 0.3, 0, model_context)
    for original, edited in zip(TEXTS, attacked):
        before, after = original.split(), edited.split()
        assert len(after) == len(before)
        changed = sum(x != y for x, y in zip(before, after))
        assert 1 <= changed <= round(0.3 * len(before)) + 1
        assert all(w.strip(".,").isalpha() for x, w in zip(before, after) if x != w)


@pytest.mark.slow
def test_paraphrase_rewrites_the_chosen_sentences(model_context):
    attacked = get_attack("paraphrase").apply(TEXTS, 0.5, 0, model_context)
    for original, edited in zip(TEXTS, attacked):
        spans = sentence_spans(original)
        kept = [original[a:b] for a, b in spans if original[a:b] in edited]
        assert edited != original
        assert len(kept) >= len(spans) - round(0.5 * len(spans))  # only the chosen half is rewritten
