"""gumbel:, synthid:, hf:synthid and vllm:gumbel specs through the detector service over real HTTP (werkzeug
on a loopback port): detected when the scheme's own sampler chose the tokens, a key scored only under its
own spec, the detect scope shown no per-unit value, verdicts stored with their spec and audit event."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from http_fixtures import call, make_token, serve, shared_vocabulary
from sampling_texts import as_text, encode, sampled_ids, transformers_synthid_ids, word_ids
from sqlalchemy import select

from api.cli import main
from api.detector.app import create_app, services_of
from db.rows import AuditEventRow, VerdictRow
from detector.disclosure import DETECT_FIELDS
from detector.scoring_request import DetectOptions
from watermark.keys import Keyring
from watermark.scheme import make_watermark

SPECS = {"g1": "gumbel:h=4", "s1": "synthid:h=4", "v1": "vllm:gumbel"}
KGW_KEY = "kgw1"
HF_KEYS = [654, 400, 836, 123, 340, 443, 597, 160, 57, 29, 590, 639, 13, 715, 468]
HF_SPEC = f"hf:synthid,keys={':'.join(map(str, HF_KEYS))},ngram_len=5"
WORDS = 64  # chosen words per text: each carries several bits of evidence in the toy distribution
ALPHA = 1e-5


@pytest.fixture
def keyring(provmark_home):
    ring = Keyring(provmark_home)
    for key_id, spec in SPECS.items():  # fixed secrets: every run tests the same keys
        ring.create(key_id, secret=hashlib.sha256(f"provmark-test/sampling-detect/{key_id}".encode()).digest(),
                    spec=spec)
    ring.create(KGW_KEY)  # the default kgw spec
    return ring


@pytest.fixture
def service(provmark_home, keyring):
    """(base_url, store, explain token, detect token) of a running detector service."""
    app = create_app({"home": provmark_home, "vocab": shared_vocabulary()})
    store = services_of(app).store
    with serve(app) as base_url:
        yield base_url, store, make_token(store, "detect", "explain"), make_token(store, "detect")
    store.close()


def watermarked(keyring, key_id: str, seed: int = 1) -> str:
    vocab = shared_vocabulary()
    mark = make_watermark(SPECS[key_id], keyring.secret(key_id), vocab.vocab_size, key_id)
    return as_text(vocab, sampled_ids(vocab, mark, WORDS, seed))


def detect(base_url, token, text, **options):
    return call("POST", base_url + "/v1/detect", {"text": text, **options}, token=token)


@pytest.mark.parametrize("key_id", sorted(SPECS))
def test_text_chosen_by_the_schemes_own_sampler_is_detected_stored_and_audited(service, keyring, key_id):
    base_url, store, explain, detect_only = service
    text = watermarked(keyring, key_id)
    status, body, _ = detect(base_url, explain, text, watermark=SPECS[key_id], windows=True, explain=True)
    assert status == 200, body
    assert body["verdict"] == "watermarked" and body["key_id"] == key_id and body["p_value"] < ALPHA
    assert body["z_score"] > 4.0 and body["num_tokens_scored"] > 0 and body["num_green_tokens"] is None
    statistic = body["statistic"]
    if SPECS[key_id].startswith("synthid"):
        assert statistic["mean_g"] > 0.5 and statistic["ones"] > statistic["trials"] / 2
        assert len(next(t for t in body["explanation"] if t["scored"])["g_values"]) == 30
    else:
        assert statistic["sum"] > body["num_tokens_scored"]  # E[s] = 1 per unit under H0
        assert all(t["score"] >= 0 for t in body["explanation"] if t["scored"])
    with store.read() as session:
        row = session.get(VerdictRow, body["id"])
        event = session.scalars(select(AuditEventRow).where(AuditEventRow.subject_id == body["id"])).one()
    assert row.spec == body["watermark"] and row.key_id == key_id and row.options["statistic"] == statistic
    details = json.loads(event.details) if isinstance(event.details, str) else event.details
    assert event.kind == "detection" and details["spec_fingerprint"] == body["fingerprint"]

    status, shown, _ = detect(base_url, detect_only, text, watermark=SPECS[key_id])
    assert status == 200 and shown["verdict"] == "watermarked"
    assert set(shown) == {*DETECT_FIELDS, "disclosure", "z_score", "p_value", "key_id", "decided_by", "windows",
                          "calibration_id", "spoof_suspected", "id", "provenance", "credentials", "spec_fingerprint",
                          "paraphrase_of_own_output"}  # no statistic, no counts, no explanation


def test_a_key_is_scored_only_under_its_own_family_and_spec(service, keyring):
    base_url, _, explain, _ = service
    text = watermarked(keyring, "g1")
    for key_id, spec in (("kgw1", "gumbel:h=4"), ("g1", "kgw:"), ("g1", "synthid:h=4"), ("s1", "gumbel:h=4"),
                         ("g1", "gumbel:h=3"), ("g1", "vllm:gumbel")):
        status, body, _ = detect(base_url, explain, text, watermark=spec, keys=[key_id])
        assert status == 422 and body["error"]["code"] == "spec_not_bound_to_key", (key_id, spec, body)
        assert f"key {key_id} is bound to" in body["error"]["message"]
    # with every detection key: only the keys bound to the spec are tested
    status, body, _ = detect(base_url, explain, text, watermark="gumbel:h=4")
    assert status == 200 and [k["key_id"] for k in body["keys"]] == ["g1"]
    status, body, _ = detect(base_url, explain, text, watermark="gumbel:h=5")
    assert status == 422 and "no detection key is bound to gumbel:h=5" in body["error"]["message"]


def test_naming_keys_without_a_spec_scores_under_the_keys_own_spec(service, keyring):
    """What the generation side does (a request naming no spec writes the key's own): `detect --key g1`
    verifies g1's gumbel text without the caller restating its spec; keys of different specs need one."""
    base_url, _, explain, _ = service
    status, body, _ = detect(base_url, explain, watermarked(keyring, "g1"), keys=["g1"])
    assert status == 200 and body["verdict"] == "watermarked", body
    assert body["watermark"].startswith("gumbel:h=4") and body["key_id"] == "g1"
    status, body, _ = detect(base_url, explain, watermarked(keyring, "g1"), keys=["g1", "s1"])
    assert status == 422 and body["error"]["code"] == "spec_not_bound_to_key"
    assert "g1: gumbel:h=4" in body["error"]["message"] and "s1: synthid:h=4" in body["error"]["message"]
    status, body, _ = detect(base_url, explain, "a few human words, nothing more than that", keys=["kgw1"])
    assert status == 200 and body["watermark"].startswith("kgw:scheme=selfhash,h=4"), body


@pytest.mark.parametrize("spec", ["gumbel:h=0", "synthid:layers=99", "gumbel:colour=red", "vllm:kgw",
                                  "hf:synthid,ngram_len=5"])
def test_bad_sampling_specs_are_a_json_4xx_naming_the_field(service, spec):
    base_url, _, explain, _ = service
    status, body, _ = detect(base_url, explain, "some words to score here", watermark=spec)
    error = body["error"]
    assert status == 422 and error["code"] == "invalid_fields" and error["details"][0]["field"] == "watermark"
    assert error["details"][0]["message"].split(":")[0] in ("h", "layers", "colour", "vllm", "keys"), body


ONE_TOKEN_WORDS = ("Silver", "Forest", "Engine", "Hello", "Water", "Apple", "House", "Green", "River", "Stone")


@pytest.mark.parametrize("key_id", sorted(SPECS))
def test_the_detect_scope_answer_for_one_unit_is_the_same_whatever_its_value(service, keyring, key_id):
    """A text with one scored unit: the unit's value (Gumbel score, SynthID g-values) must not show, so two
    texts that differ only in that unit, its lowest and highest value, get the same detect-scope answer."""
    base_url, _, explain, detect_only = service
    vocab = shared_vocabulary()
    mark = make_watermark(SPECS[key_id], keyring.secret(key_id), vocab.vocab_size, key_id)
    if mark.spec.kind == "vllm:gumbel":  # vLLM scores every token (contexts padded): a one-token text
        prefix, candidates = [], [encode(vocab, w)[0] for w in ONE_TOKEN_WORDS]
    else:
        prefix, candidates = encode(vocab, "The cat sat on"), word_ids(vocab)
        assert len(prefix) == mark.context_width
    values = {}
    for word in candidates:
        scored = mark.scored_positions(torch.tensor(prefix + [word]))[0]
        values[word] = float(scored[-1].sum()) if scored.ndim == 2 else float(scored[-1])
    low, high = min(values, key=values.get), max(values, key=values.get)
    assert values[high] > values[low]
    answers, full = [], []
    for word in (low, high):
        text = as_text(vocab, prefix + [word])
        status, body, _ = detect(base_url, detect_only, text, watermark=SPECS[key_id])
        assert status == 200
        answers.append({k: v for k, v in body.items() if k not in ("id", "text_sha256", "text_length")})
        full.append(detect(base_url, explain, text, watermark=SPECS[key_id])[1])
    assert answers[0] == answers[1] and answers[0]["verdict"] == "insufficient_text"
    assert answers[0]["z_score"] is None and answers[0]["p_value"] is None
    assert [f["num_tokens_scored"] for f in full] == [1, 1] and full[0]["p_value"] > full[1]["p_value"]


def test_transformers_synthid_token_ids_are_detected_through_the_service(service):
    base_url, _, explain, detect_only = service
    vocab = shared_vocabulary()
    text = as_text(vocab, transformers_synthid_ids(vocab, HF_KEYS, 5, WORDS, seed=3))
    status, body, _ = detect(base_url, explain, text, watermark=HF_SPEC)
    assert status == 200 and body["verdict"] == "watermarked" and body["p_value"] < ALPHA and body["key_id"] is None
    assert body["statistic"]["mean_g"] > 0.5 and body["common_units"] is None  # counts every position, as transformers
    other = HF_SPEC.replace(":".join(map(str, HF_KEYS)), ":".join(str(k + 1) for k in HF_KEYS))
    status, body, _ = detect(base_url, explain, text, watermark=other)
    assert status == 200 and body["verdict"] != "watermarked"
    status, body, _ = detect(base_url, explain, text, watermark=HF_SPEC, keys=["g1"])
    assert status == 422 and body["error"]["details"][0]["field"] == "keys"


def test_cli_detect_and_detect_batch_take_sampling_specs(keyring, tmp_path, capsys):


    text = watermarked(keyring, "s1", seed=4)
    source = tmp_path / "in.txt"
    source.write_text(text, encoding="utf-8")
    assert main(["detect", str(source), "--watermark", "synthid:h=4", "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["verdict"] == "watermarked" and verdict["key_id"] == "s1" and verdict["statistic"]["mean_g"] > 0.5
    assert main(["detect", str(source), "--watermark", "synthid:h=4"]) == 0
    assert "mean g" in capsys.readouterr().out
    assert main(["detect", str(source), "--watermark", "gumbel:h=99"]) == 2
    assert "h: expected an integer in 1..64" in capsys.readouterr().err
    assert main(["detect", str(source), "--watermark", "gumbel:h=4", "--key", "kgw1"]) == 2
    assert "bound to" in capsys.readouterr().err

    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"id": "a", "text": text, "watermark": "synthid:h=4"}) + "\n"
                    + json.dumps({"id": "b", "text": watermarked(keyring, "g1"), "watermark": "gumbel:h=4"}) + "\n",
                    encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["detect-batch", str(rows), "--out", str(out), "--workers", "1", "--no-progress", "--store"]) == 0
    verdicts = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(v["verdict"], v["key_id"]) for v in verdicts] == [("watermarked", "s1"), ("watermarked", "g1")]


def test_human_text_is_not_flagged_beyond_the_binomial_bound_for_a_fixed_key(keyring):
    """Held-out human paragraphs (not used to build the common-unit table or to calibrate) through the
    detector under ONE fixed key per spec: flagged at alpha no more often than Binomial(n, alpha) allows
    (an upper bound: human texts share units, so their p-values are not independent)."""
    from scipy import stats

    from detector import human_corpora
    from detector.service import Detector

    vocab = shared_vocabulary()
    paragraphs = human_corpora.held_out_texts(vocab)["paragraphs"][:300]
    texts = [vocab.tokenizer.decode(ids.tolist()) for ids in paragraphs]
    detector = Detector(vocab=vocab, keyring=keyring)
    for key_id in ("g1", "s1"):
        p = np.array([detector.detect(t, spec=SPECS[key_id], keys=[key_id]).p_value for t in texts])
        for alpha in (0.01, 0.05):
            high = stats.binom.ppf(1 - 1e-6, len(p), alpha)
            assert (p <= alpha).sum() <= high, (key_id, alpha, int((p <= alpha).sum()), high)


def test_the_reference_signal_behind_min_tokens_is_what_the_tournament_gives():
    """SYNTHID_REFERENCE_MEAN_G: mean g over 30 layers of the tournament winner when the model spreads its
    probability over 4 tokens, recomputed with the closed form the sampler uses (4 standard errors)."""
    from detector.sampling_verdict import min_scored_units
    from watermark.schemes.sampling import GUMBEL_REFERENCE_SCORE, SYNTHID_REFERENCE_MEAN_G
    from watermark.synthid import tournament_probs

    n, layers, choices = 20_000, 30, 4
    gen = torch.Generator().manual_seed(11)
    g = torch.randint(0, 2, (layers, n, choices), generator=gen).double()
    winner = tournament_probs(torch.full((n, choices), 1.0 / choices, dtype=torch.float64),
                              lambda d: g[d] if d < layers else None)
    mean_g = (winner.unsqueeze(0) * g).sum(dim=2).mean(dim=0)  # per text: expected mean g of the winner
    se = float(mean_g.std()) / np.sqrt(n)
    assert abs(float(mean_g.mean()) - SYNTHID_REFERENCE_MEAN_G) < 4 * se
    assert GUMBEL_REFERENCE_SCORE == pytest.approx(sum(1 / k for k in range(1, choices + 1)))
    vocab = shared_vocabulary()
    gumbel = make_watermark("gumbel:h=4", b"k" * 32, vocab.vocab_size)
    synthid = make_watermark("synthid:h=4", b"k" * 32, vocab.vocab_size)
    assert (min_scored_units(gumbel, 4.0), min_scored_units(synthid, 4.0)) == (14, 23)


def test_several_keys_bound_to_one_spec_are_tested_together_with_holm(keyring):
    """Two gumbel keys: the text's own key is the best, Holm-corrected over both; the window report names
    it too; forced positions are left out of T."""
    from detector.service import Detector

    keyring.create("g2", secret=hashlib.sha256(b"provmark-test/sampling-detect/g2").digest(), spec=SPECS["g1"])
    text = watermarked(keyring, "g1", seed=5)
    detector = Detector(vocab=shared_vocabulary(), keyring=keyring)
    verdict = detector.detect(text, spec="gumbel:h=4", options=DetectOptions(windows=True))
    by_key = {k["key_id"]: k for k in verdict.keys}
    assert set(by_key) == {"g1", "g2"} and verdict.key_id == "g1" and verdict.verdict == "watermarked"
    assert by_key["g1"]["p_value_corrected"] == pytest.approx(min(1.0, 2 * by_key["g1"]["p_value"]))
    assert by_key["g2"]["p_value"] > 1e-3 and verdict.p_value == by_key["g1"]["p_value_corrected"]
    assert verdict.windows["best"]["key_id"] == "g1"
    forced = detector.detect(text, spec="gumbel:h=4", keys=["g1"], options=DetectOptions(forced_positions=range(4, 24)))
    assert forced.num_forced_positions == 20
    assert forced.num_tokens_scored == detector.detect(text, spec="gumbel:h=4", keys=["g1"]).num_tokens_scored - 20
