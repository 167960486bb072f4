"""Scoring units (dedup, window counts, decision, minimum length), several keys, explanations,
and equality with transformers' WatermarkDetector on hf specs."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, WatermarkDetector, WatermarkingConfig
from transformers.generation.logits_process import WatermarkLogitsProcessor

from detector.scoring import Decision, min_scored_tokens, previous_occurrence
from detector.scoring_request import DetectOptions
from detector.service import Detector
from detector.tokenizing import tokenize
from detector.windows import window_counts
from watermark.config import SpecError, WatermarkSpec
from watermark.key_info import KeyNotFoundError
from watermark.scheme import Watermark
from watermark.vocab import encode, encode_with_offsets, load_vocabulary

V = 49152


class TwoKeys:
    """Deterministic stand-in keyring."""

    path = Path("/nonexistent/keyring.json")
    _secrets = {"ka": bytes(range(32)), "kb": bytes(range(1, 33))}

    def detection_keys(self):
        return [SimpleNamespace(key_id=k) for k in self._secrets]

    def secret(self, key_id):
        if key_id not in self._secrets:
            raise KeyNotFoundError(f"no key {key_id}")
        return self._secrets[key_id]


@pytest.fixture(scope="module")
def vocab():
    return load_vocabulary()


@pytest.fixture(scope="module")
def detector(vocab):
    return Detector(vocab=vocab, keyring=TwoKeys())


@pytest.fixture(scope="module")
def human_texts():
    path = importlib.metadata.distribution("gensim").locate_file("gensim/test/test_data/lee_background.cor")
    lines = [line.strip() for line in Path(str(path)).read_text(encoding="utf-8").splitlines() if line.strip()]
    return [lines[0][:700], lines[5][:700]]


# ----------------------------------------------------------------------------------- units


@pytest.mark.parametrize("spec", ["kgw:scheme=lefthash,h=2", "kgw:scheme=unigram", "hf:context_width=2"])
def test_previous_occurrence_matches_a_dictionary_of_ngrams(spec):
    wm = Watermark(spec, bytes(32) if spec.startswith("kgw") else None, V)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 6, (400,), generator=gen)  # tiny alphabet: many repeats
    expected, last = [], {}
    for i, gram in enumerate(map(tuple, wm.ngrams(ids).tolist())):
        expected.append(last.get(gram, -1))
        last[gram] = i
    assert previous_occurrence(wm, ids).tolist() == expected


@pytest.mark.parametrize("scheme", ["minhash", "selfhash"])
def test_seeded_schemes_dedup_at_least_every_repeated_ngram(scheme):
    wm = Watermark(f"kgw:scheme={scheme},h=3", bytes(32), V)
    ids = torch.randint(0, 8, (300,), generator=torch.Generator().manual_seed(2))
    prev = previous_occurrence(wm, ids)
    grams = [tuple(g) for g in wm.ngrams(ids).tolist()]
    flags = wm.green_flags(ids).numpy()
    for i, p in enumerate(prev):
        if grams[i] in grams[:i]:
            assert p >= 0  # an n-gram seen before is never counted again
        if p >= 0:
            assert flags[p] == flags[i] and grams[p][-1] == grams[i][-1]  # same unit, same coin


@pytest.mark.parametrize("dedup", [True, False])
def test_window_counts_equal_brute_force(dedup):
    gen = np.random.default_rng(3)
    tokens = gen.integers(0, 5, 300)
    green = gen.random(300) < 0.3
    prev = np.full(300, -1)
    last = {}
    for i, t in enumerate(tokens):
        prev[i] = last.get(t, -1)
        last[t] = i
    for size in (1, 7, 32, 300):
        total, greens = window_counts(green, prev if dedup else None, size)
        for a in range(0, 300 - size + 1, 13):
            idx = range(a, a + size)
            counted = [i for i in idx if not dedup or prev[i] < a]
            assert total[a] == len(counted) and greens[a] == sum(green[i] for i in counted)


def test_decision_and_minimum_length_come_from_the_math():
    assert Decision.make(4.0).alpha == pytest.approx(3.167e-5, rel=1e-3)
    assert Decision.make(fpr=1e-3).z_threshold == pytest.approx(3.0902, rel=1e-4)
    for bad in (dict(z_threshold=-1.0), dict(fpr=0.0), dict(fpr=1.5)):
        with pytest.raises(ValueError):
            Decision.make(**bad)
    spec = WatermarkSpec.default()  # gamma 0.25, delta 2: best-case green fraction 0.711
    assert min_scored_tokens(spec, 4.0) == 15
    assert min_scored_tokens(spec.with_(hard=True), 4.0) == 6  # all green: z = sqrt(3T) >= 4
    assert min_scored_tokens(spec.with_(delta=1.0), 4.0) > min_scored_tokens(spec, 4.0)
    assert min_scored_tokens(spec, 5.0) > min_scored_tokens(spec, 4.0)


def test_chunked_tokenization_equals_the_tokenizer(vocab):
    path = importlib.metadata.distribution("gensim").locate_file("gensim/test/test_data/lee_background.cor")
    corpus = Path(str(path)).read_text(encoding="utf-8")
    for text in (corpus[:3000], corpus[:40000], "x" * 5000, "9 " * 3000, corpus[:5000].replace(" ", "\n")):
        assert tokenize(vocab, text, False)[0] == encode(vocab, text)
        ids, offsets = tokenize(vocab, text, True)
        expected_ids, expected_offsets = encode_with_offsets(vocab, text)
        assert ids == expected_ids and [tuple(o) for o in offsets] == [tuple(o) for o in expected_offsets]


# ------------------------------------------------------------------------------- detector


def test_several_keys_are_holm_corrected_and_the_verdict_is_json(detector, human_texts):
    verdict = detector.detect(human_texts[0])
    assert [k["key_id"] for k in verdict.keys] == ["ka", "kb"]
    raw = sorted(k["p_value"] for k in verdict.keys)
    assert verdict.p_value == pytest.approx(min(1.0, 2 * raw[0]))
    assert verdict.key_id in ("ka", "kb") and verdict.verdict == "not_watermarked"
    single = detector.detect(human_texts[0], keys=[verdict.key_id])
    assert single.z_score == verdict.z_score and single.p_value <= verdict.p_value
    payload = json.loads(json.dumps(verdict.to_dict(), allow_nan=False))
    for field in ("verdict", "z_score", "p_value", "num_tokens_scored", "num_green_tokens", "green_fraction",
                  "key_id", "watermark", "fingerprint", "windows", "normalizations"):
        assert field in payload
    assert bytes(range(32)).hex() not in json.dumps(payload)


def test_bad_keys_and_specs_raise_clear_errors(detector):
    with pytest.raises(KeyNotFoundError):
        detector.detect("some text here", keys=["nope"])
    with pytest.raises(ValueError, match="hf spec is public"):
        detector.detect("some text here", keys=["ka"], spec="hf:context_width=1")
    with pytest.raises(SpecError):
        detector.detect("some text here", spec="kgw:gamma=3")
    empty = Detector(vocab=detector.vocab, keyring=SimpleNamespace(path=TwoKeys.path, detection_keys=lambda: []))
    with pytest.raises(KeyNotFoundError, match="keys create"):
        empty.detect("some text here")


def test_short_text_is_insufficient_and_explanation_offsets_are_in_the_original(detector):
    short = detector.detect("Hi there.")
    assert short.verdict == "insufficient_text" and short.num_tokens_scored < short.min_tokens
    text = "Ｔhe  quick\u200b brown fox jumps over the lazy dog, again and again."
    verdict = detector.detect(text, keys=["ka"], options=DetectOptions(explain=True))
    tokens = verdict.explanation
    assert len(tokens) == verdict.num_tokens
    assert all(t["text"] == text[t["char_start"]:t["char_end"]] for t in tokens)
    assert tokens[0]["text"] == "Ｔhe" and not tokens[0]["scored"]
    assert sum(t["green"] and t["counted"] for t in tokens if t["scored"]) == verdict.num_green_tokens
    assert sum(t["counted"] for t in tokens) == verdict.num_tokens_scored


# -------------------------------------------------------------------- transformers equality


def _hf_watermarked_text(vocab, processor: WatermarkLogitsProcessor, selfhash: bool, length: int, seed: int) -> str:
    """Space-prefixed word tokens, each green under transformers' own green lists w.p. ~0.9."""
    tokenizer = vocab.tokenizer
    pool = [i for i, p in enumerate(tokenizer.convert_ids_to_tokens(list(range(8000))))
            if p and p.startswith("Ġ") and p[1:].isalpha() and p[1:].islower() and len(p) > 3]
    gen = torch.Generator().manual_seed(seed)
    ids = [pool[int(i)] for i in torch.randint(0, len(pool), (4,), generator=gen)]
    for _ in range(length):
        want_green = torch.rand(1, generator=gen).item() < 0.9
        for _attempt in range(12):
            candidate = pool[int(torch.randint(0, len(pool), (1,), generator=gen))]
            prefix = torch.tensor(ids + [candidate] if selfhash else ids)
            if not want_green or candidate in processor._get_greenlist_ids(prefix):
                break
        ids.append(candidate)
    return tokenizer.decode(ids)


@pytest.mark.parametrize("scheme, width", [("lefthash", 1), ("selfhash", 3)])
def test_hf_specs_equal_transformers_watermark_detector(vocab, human_texts, scheme, width):
    config = WatermarkingConfig(greenlist_ratio=0.25, bias=2.0, seeding_scheme=scheme, context_width=width)
    spec = f"hf:seeding_scheme={scheme},greenlist_ratio=0.25,bias=2.0,context_width={width}"
    model_config = LlamaConfig(vocab_size=V, bos_token_id=vocab.bos_token_id, eos_token_id=vocab.eos_token_id,
                               hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1,
                               num_key_value_heads=1)
    processor = WatermarkLogitsProcessor(V, "cpu", greenlist_ratio=0.25, seeding_scheme=scheme, context_width=width)
    marked = _hf_watermarked_text(vocab, processor, scheme == "selfhash", 60, seed=5)
    detector = Detector(vocab=vocab, keyring=TwoKeys())
    for text in [marked, human_texts[1][:300]]:
        input_ids = torch.tensor([vocab.tokenizer(text, add_special_tokens=False).input_ids])
        for dedup in (True, False):
            reference = WatermarkDetector(model_config, "cpu", config, ignore_repeated_ngrams=dedup)(
                input_ids, return_dict=True)
            ours = detector.detect(text, spec=spec, options=DetectOptions(dedup=dedup, normalize=False))
            assert ours.num_tokens_scored == reference.num_tokens_scored[0]
            assert ours.num_green_tokens == reference.num_green_tokens[0]
            assert abs(ours.z_score - float(reference.z_score[0])) <= 1e-9
    assert detector.detect(marked, spec=spec, options=DetectOptions(normalize=False)).verdict == "watermarked"
