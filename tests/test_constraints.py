"""Constrained decoding: spec validation, masks on the real SmolLM2 tokenizer, and generation with the
real model (a local sampling loop: forward -> constraint mask -> watermark bias -> sample) showing every
output matches its constraint, with and without a watermark."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from generation.constraints.constraint import (
    FORCED_BELOW,
    ConstraintCompiler,
    ConstraintError,
    ConstraintSpec,
    apply_constraints_,
    compute_masks,
    forced_positions,
    start_masks,
)
from watermark.config import WatermarkSpec
from watermark.scheme import Watermark
from watermark.stats import z_score

SECRET = bytes(range(32))  # a fixed test key
SEEDS = range(6)  # per constraint kind, each run with and without the watermark: 12 outputs per kind
Z_DETECT = 4.0  # the detector's threshold: one-sided p ~ 3.2e-5 under the null (z ~ N(0, 1))

REGEX = r"(?:[A-Z][a-z]{1,8} ){1,3}is [0-9]{1,3} years old\."
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "year": {"type": "integer", "minimum": 1800, "maximum": 2030},
        "genres": {"type": "array", "items": {"enum": ["fiction", "poetry", "history"]}, "maxItems": 3},
        "summary": {"type": "string", "maxLength": 60},
    },
    "required": ["name", "year", "genres", "summary"],
    "additionalProperties": False,
}
CHOICES = ["red", "green", "blue", "dark blue"]


@pytest.fixture(scope="module")
def vocab():
    from watermark.vocab import load_vocabulary

    return load_vocabulary()


@pytest.fixture(scope="module")
def compiler(vocab):
    return ConstraintCompiler(vocab.tokenizer, vocab.vocab_size, [vocab.eos_token_id])


# ---------------------------------------------------------------- specs, no tokenizer

@pytest.mark.parametrize("kwargs, field", [
    ({}, "constraint"),
    ({"regex": "a", "choice": ["a"]}, "constraint"),
    ({"regex": "[a-"}, "regex"),
    ({"regex": ""}, "regex"),
    ({"json_schema": "{not json"}, "json_schema"),
    ({"json_schema": {"type": "nonsense"}}, "json_schema"),
    ({"json_schema": [1, 2]}, "json_schema"),
    ({"choice": []}, "choice"),
    ({"choice": ["ok", ""]}, "choice"),
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"allowed_token_ids": [3, -1]}, "allowed_token_ids"),
    ({"allowed_token_ids": [True]}, "allowed_token_ids"),
])
def test_spec_rejects_with_field_name(kwargs, field):
    with pytest.raises(ConstraintError, match=rf"^{field}:"):
        ConstraintSpec(**kwargs)


def test_spec_accepts_schema_string_and_dedups():
    spec = ConstraintSpec(json_schema=json.dumps(SCHEMA))
    assert spec.json_schema == SCHEMA and spec.kind == "json_schema"
    assert ConstraintSpec(choice=["a", "b", "a"]).choice == ["a", "b"]
    assert ConstraintSpec(allowed_token_ids=[5, 3, 5]).allowed_token_ids == [3, 5]


# ---------------------------------------------------------------- masks on the real tokenizer

def test_compiler_checks_vocab_sizes(vocab):
    with pytest.raises(ValueError, match="vocab_size"):
        ConstraintCompiler(vocab.tokenizer, len(vocab.tokenizer) - 1)
    compiler = ConstraintCompiler(vocab.tokenizer, vocab.vocab_size)
    with pytest.raises(ConstraintError, match="allowed_token_ids"):
        compiler.compile(ConstraintSpec(allowed_token_ids=[vocab.vocab_size]))


def test_fixed_string_allows_one_token_per_step_then_only_eos(compiler, vocab):
    text = "Provenance is a chain of custody, 1 link at a time."
    constraint = compiler.compile(ConstraintSpec(regex=re.escape(text)))
    taken, counts = [], []
    generator = torch.Generator().manual_seed(0)
    while not constraint.is_complete():
        logits = torch.randn(1, vocab.vocab_size, generator=generator)
        counts.append(apply_constraints_(logits, [constraint])[0])
        token = int(logits.argmax())
        constraint.advance(token)
        taken.append(token)
        assert len(taken) < 200
    assert vocab.tokenizer.decode(taken) == text
    assert counts == [1] * len(taken)
    assert forced_positions(counts) == list(range(len(taken)))
    row = torch.zeros(vocab.vocab_size, dtype=torch.bool)
    constraint.fill_mask(row)  # complete: EOS and nothing else
    assert row.nonzero()[:, 0].tolist() == [vocab.eos_token_id] and constraint.allowed_count() == 1


def test_unconstrained_rows_untouched_and_masks_exact(compiler, vocab):
    c = compiler.compile(ConstraintSpec(choice=CHOICES))
    ids = compiler.compile(ConstraintSpec(allowed_token_ids=[5, 77, vocab.eos_token_id]))
    logits = torch.randn(4, vocab.vocab_size, generator=torch.Generator().manual_seed(1))
    before = logits.clone()
    counts = apply_constraints_(logits, [None, c, None, ids])
    assert counts[0] is None and counts[2] is None and counts[3] == 3
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    live = torch.isfinite(logits[3]).nonzero()[:, 0].tolist()
    assert live == sorted([5, 77, vocab.eos_token_id]) and torch.equal(logits[3, live], before[3, live])
    assert int(torch.isfinite(logits[1]).sum()) == counts[1] > 0
    for token in torch.isfinite(logits[1]).nonzero()[:, 0].tolist():  # every allowed token starts some choice
        piece = vocab.tokenizer.decode([token])
        assert any(choice.startswith(piece) for choice in CHOICES), piece
    with pytest.raises(ConstraintError):
        ids.advance(6)


def test_background_masks_equal_inline_and_copies_are_independent(compiler, vocab):
    rows = [compiler.compile(ConstraintSpec(json_schema=SCHEMA)), None, compiler.compile(ConstraintSpec(regex=REGEX))]
    # one thread at a time per matcher (llguidance objects are not shareable across concurrent threads:
    # "Already borrowed"); the engine only touches them after the background fill has finished
    background = start_masks(rows, vocab.vocab_size).result()
    inline = compute_masks(rows, vocab.vocab_size)
    assert torch.equal(background.allowed, inline.allowed)
    assert start_masks([None, None], vocab.vocab_size) is None
    first = vocab.tokenizer.encode('{"name', add_special_tokens=False)[0]
    twin = rows[0].copy()
    rows[0].advance(first)
    assert not torch.equal(compute_masks([rows[0]], vocab.vocab_size).allowed, compute_masks([twin], vocab.vocab_size).allowed)
    assert compiler.compile(ConstraintSpec(json_schema=SCHEMA)).matcher is not rows[0].matcher  # cache hands out copies


# ---------------------------------------------------------------- generation with the real model

@pytest.fixture(scope="module")
def model():
    from generation.models import load_model

    # one torch thread: on a shared 2-core machine two OpenMP threads ran decode steps 5-10x slower
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield load_model()
    finally:
        torch.set_num_threads(threads)


def _prompt(model, text: str) -> list[int]:
    encoded = model.vocab.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


@torch.inference_mode()
def _generate(model, prompt: list[int], constraints, marks, seeds, max_new: int):
    """Sample each row (temperature 1) under its constraint and optional watermark until the constraint
    completes, EOS, or max_new. Returns per row (token ids without EOS, allowed counts)."""
    rows = len(constraints)
    eos = model.vocab.eos_token_id
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    out = model.model(input_ids=torch.tensor([prompt] * rows), use_cache=True, logits_to_keep=1)
    histories = [list(prompt) for _ in range(rows)]
    tokens, counts = [[] for _ in range(rows)], [[] for _ in range(rows)]
    done = [False] * rows
    for _ in range(max_new):
        logits = out.logits[:, -1].float()
        step_counts = apply_constraints_(logits, [c if not d else None for c, d in zip(constraints, done)])
        for r, wm in enumerate(marks):
            if wm is not None and not done[r]:
                logits[r:r + 1] = wm.bias(logits[r:r + 1].clone(), [histories[r]])
        probs = logits.softmax(-1)
        picked = []
        for r in range(rows):
            token = int(torch.multinomial(probs[r], 1, generator=generators[r]))
            picked.append(token)
            if done[r]:
                continue
            constraints[r].advance(token)
            if token == eos:
                done[r] = True
                continue
            tokens[r].append(token), counts[r].append(step_counts[r]), histories[r].append(token)
            done[r] = constraints[r].is_complete()
        if all(done):
            break
        out = model.model(input_ids=torch.tensor(picked)[:, None], past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
    return tokens, counts, done


def _run_kind(model, compiler, spec, prompt_text, max_new):
    seeds = [s for s in SEEDS for _ in (0, 1)]
    marks = [Watermark(WatermarkSpec.default(), SECRET, model.vocab.vocab_size) if i % 2 else None for i in range(len(seeds))]
    constraints = [compiler.compile(spec) for _ in seeds]
    tokens, _, done = _generate(model, _prompt(model, prompt_text), constraints, marks, seeds, max_new)
    assert all(done), "a bounded grammar must finish within max_new"
    return [model.vocab.tokenizer.decode(t) for t in tokens]


@pytest.mark.slow
def test_regex_outputs_match(model, compiler):
    texts = _run_kind(model, compiler, ConstraintSpec(regex=REGEX), "Tell me about a person and their age.", 80)
    for text in texts:
        assert re.fullmatch(REGEX, text), text


@pytest.mark.slow
def test_json_schema_outputs_validate(model, compiler):
    import jsonschema

    texts = _run_kind(model, compiler, ConstraintSpec(json_schema=SCHEMA), "Describe a book as JSON.", 160)
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.slow
def test_choice_and_token_set(model, compiler, vocab):
    assert set(_run_kind(model, compiler, ConstraintSpec(choice=CHOICES), "Pick a colour.", 10)) <= set(CHOICES)
    allowed = sorted({*vocab.tokenizer.encode(" yes no maybe!", add_special_tokens=False), vocab.eos_token_id})
    seeds = list(SEEDS)
    constraints = [compiler.compile(ConstraintSpec(allowed_token_ids=allowed)) for _ in seeds]
    marks = [Watermark(WatermarkSpec.default(), SECRET, vocab.vocab_size) if s % 2 else None for s in seeds]
    tokens, counts, _ = _generate(model, _prompt(model, "Answer yes or no."), constraints, marks, seeds, 12)
    assert all(set(t) <= set(allowed) for t in tokens)
    assert all(n == len(allowed) for row in counts for n in row)


@pytest.mark.slow
def test_schema_constrained_text_is_detected(model, compiler):
    """~200 tokens of JSON with free-text fields under the default watermark: z >= 4 on the output's ids,
    with every (h+1)-gram counted once; leaving out the forced positions only helps."""
    schema = {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 60},
        "review": {"type": "string", "minLength": 500, "maxLength": 900},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5}},
        "required": ["title", "review", "stars"], "additionalProperties": False}
    wm = Watermark(WatermarkSpec.default(), SECRET, model.vocab.vocab_size)
    seeds = [11, 12]
    constraints = [compiler.compile(ConstraintSpec(json_schema=schema)) for _ in seeds]
    tokens, counts, _ = _generate(model, _prompt(model, "Write a long review of your favourite novel as JSON."),
                                  constraints, [wm] * len(seeds), seeds, 220)
    for ids, allowed in zip(tokens, counts):
        assert len(ids) >= 180
        for skip in (set(), set(forced_positions(allowed))):
            green, total = _score(wm, ids, skip)
            assert z_score(green, total, wm.gamma) >= Z_DETECT, (green, total, len(skip))


def _score(wm: Watermark, ids: list[int], skip: set[int]) -> tuple[int, int]:
    """Green count and scored positions: positions >= h not in ``skip``, each (h+1)-gram once."""
    flags = wm.green_flags(ids).tolist()
    grams = [tuple(g) for g in wm.ngrams(ids).tolist()]
    seen, green, total = set(), 0, 0
    for offset, (flag, gram) in enumerate(zip(flags, grams)):
        if offset + wm.context_width in skip or gram in seen:
            continue
        seen.add(gram)
        green, total = green + flag, total + 1
    return green, total


def test_fully_forced_text_scores_nothing(compiler, vocab):
    """A constraint that leaves one token per step: every position is forced, so a detector that knows
    it has nothing to score (insufficient), instead of calling watermarked text unwatermarked."""
    text = "The quick brown fox jumps over the lazy dog while the committee reviews the audit log again."
    constraint = compiler.compile(ConstraintSpec(regex=re.escape(text)))
    wm = Watermark(WatermarkSpec.default(), SECRET, vocab.vocab_size)
    ids, counts = [], []
    generator = torch.Generator().manual_seed(3)
    while not constraint.is_complete():
        logits = torch.randn(1, vocab.vocab_size, generator=generator)
        counts.append(apply_constraints_(logits, [constraint])[0])
        wm.bias(logits, [ids])
        token = int(torch.multinomial(logits.softmax(-1)[0], 1, generator=generator))
        constraint.advance(token)
        ids.append(token)
    assert all(n < FORCED_BELOW for n in counts)
    assert _score(wm, ids, set(forced_positions(counts)))[1] == 0
    assert _score(wm, ids, set())[1] > 0  # without the generator's record those positions would be scored


def test_bit_helpers_round_trip_and_odd_vocab(monkeypatch):
    from generation.constraints import masks as bits

    vocab_size = 70  # not a multiple of 32: the last word has spare bits
    ids = [0, 31, 32, 69]
    words = bits.pack_ids(ids, vocab_size)
    assert words.shape == (3,) and bits.unpack_bits(words, vocab_size).nonzero()[:, 0].tolist() == ids
    full = torch.full((2, 3), -1, dtype=torch.int32)  # every bit set, also past V
    bits.clear_tail_(full, vocab_size)
    assert bits.count_bits(full) == [vocab_size, vocab_size]
    monkeypatch.delattr(bits.np, "bitwise_count", raising=False)  # numpy < 2 path
    assert bits.count_bits(full) == [vocab_size, vocab_size]
    logits = torch.zeros(2, vocab_size)
    masks = bits.ConstraintMasks(3, [0, 2], bits.unpack_bits(torch.bitwise_not(torch.stack([words, words])), vocab_size), [4, 4])
    with pytest.raises(ValueError, match="logits"):
        masks.apply_(logits)
    logits = torch.zeros(3, vocab_size, dtype=torch.bfloat16)  # masked_fill_ path (numpy has no bfloat16)
    assert masks.apply_(logits) == [4, None, 4]
    assert torch.isfinite(logits[0]).nonzero()[:, 0].tolist() == ids and bool(torch.isfinite(logits[1]).all())
