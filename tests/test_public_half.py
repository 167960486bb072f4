"""Two-part keys (``watermark.public_key``): a detection half anyone may hold, a private half that
decides our verdict and catches spoofs steered by the published half.

The statistical test runs in a toy world over single-token words with Zipf frequencies (no model): genuine
output is sampled through ``Watermark.bias`` (the engine's call) under the two-part key; a spoofer who holds
the published half samples with that half's bias only, as strongly as it likes; unwatermarked text is the
same sampler with no bias. One fixed key, many texts, as users live it. Bounds come from binomial tails.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from http_fixtures import shared_vocabulary, single_token_words
from scipy import stats

from detector.service import Detector
from watermark.key_info import KeyringIntegrityError, KeySpecError, KeyStateError
from watermark.keys import Keyring
from watermark.public_key import SPOOF_ALPHA, PublicKey, PublicKeyError, public_half_secret, spoof_test
from watermark.scheme import Watermark, generation_watermark

KEY = "twopart"
SECRET = hashlib.sha256(b"provmark-test/two-part-key").digest()
WORDS = 3000
LENGTH = 160  # words per text
TEXTS = 40  # per kind (genuine, spoofed, unwatermarked)
SPOOF_DELTA = 4.0  # twice our delta: the spoofer makes the published half's greens as strong as it can


def test_a_two_part_key_keeps_its_secret_and_derives_a_publishable_half(tmp_path):
    ring = Keyring(tmp_path / "home")
    info = ring.create(KEY, secret=SECRET, public_half=True)
    plain = ring.create("plain")
    half = ring.public_half(KEY)
    assert info.public_half and not plain.public_half
    assert len(half) == 32 and half != SECRET and half == public_half_secret(SECRET)
    assert Keyring(tmp_path / "home").list()[0].public_half  # sealed with the key, read back
    with pytest.raises(KeyStateError, match="no public half"):
        ring.public_half("plain")
    with pytest.raises(KeySpecError, match="kgw"):
        ring.create("gumbel-two", spec="gumbel:h=4", public_half=True)
    # the flag is part of the sealed metadata: dropping it from the file is tampering, not a downgrade
    document = json.loads(ring.path.read_text())
    del document["entries"][0]["public_half"]
    ring.path.write_text(json.dumps(document))
    with pytest.raises(KeyringIntegrityError):
        Keyring(tmp_path / "home").secret(KEY)


def test_the_public_document_round_trips_holds_no_secret_and_refuses_damage(tmp_path):
    vocab = shared_vocabulary()
    ring = Keyring(tmp_path / "home")
    info = ring.create(KEY, secret=SECRET, public_half=True)
    document = PublicKey.make(KEY, info.spec, ring.public_half(KEY), vocab)
    text = document.to_json()
    assert PublicKey.from_json(text) == document
    assert SECRET.hex() not in text and document.secret == public_half_secret(SECRET)
    raw = json.loads(text)
    for change, message in [({"fingerprint": "0" * 16}, "fingerprint"), ({"detection_half": "zz"}, "detection_half"),
                            ({"spec": "gumbel:h=4"}, "spec"), ({"extra": 1}, "fields"), ({"vocab_size": True}, "vocab_size"),
                            ({"format": "v0"}, "format"), ({"key_id": "Not A Key"}, "key_id")]:
        with pytest.raises(PublicKeyError, match=message):
            PublicKey.from_json(json.dumps({**raw, **change}))
    with pytest.raises(PublicKeyError, match="not JSON"):
        PublicKey.from_json("{")


def test_generation_adds_delta_for_each_half_green_list():
    V = 5000
    mark = Watermark("kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0", SECRET, V, KEY, public_half_secret(SECRET))
    history = [[11, 12, 13, 14], [7, 7, 7, 7]]
    logits = torch.zeros(2, V)
    mark.bias(logits, history)
    contexts = torch.tensor(history)
    both = mark.green_mask(contexts).float() + mark.public_mark().green_mask(contexts).float()
    assert torch.equal(logits, 2.0 * both)
    assert mark.batch_key != Watermark(mark.spec, SECRET, V, KEY).batch_key  # never batched with the one-part key


def test_the_paired_test_is_mcnemars_exact_binomial():
    public = torch.tensor([1, 1, 1, 0, 0, 1], dtype=torch.bool).numpy()
    private = torch.tensor([0, 0, 1, 1, 0, 0], dtype=torch.bool).numpy()
    test = spoof_test(public, private)
    assert (test["public_only"], test["private_only"]) == (3, 1)
    assert test["p_value"] == pytest.approx(stats.binom.sf(2, 4, 0.5))
    assert spoof_test(public[:0], private[:0])["p_value"] == 1.0
    counted = np.array([True, False, True, True, True, True])  # the whole text's arrays, a mask of counted positions
    assert spoof_test(public, private, counted) == spoof_test(public[counted], private[counted])
    masked = spoof_test(public, private, counted)
    assert (masked["public_only"], masked["private_only"]) == (2, 1)


# ------------------------------------------------------------------------------- the toy world
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    vocab = shared_vocabulary()
    words = word_ids(vocab)
    ring = Keyring(tmp_path_factory.mktemp("two-part") / "home")
    ring.create(KEY, secret=SECRET, public_half=True)
    mark = generation_watermark(None, vocab.vocab_size, KEY, ring)
    assert mark.has_public_half
    # the spoofer holds the published half (what `keys export-public` gives anyone) and biases as hard as it likes
    spoofer = Watermark(mark.spec.with_(delta=SPOOF_DELTA), ring.public_half(KEY), vocab.vocab_size, "spoofer")
    generator = torch.Generator().manual_seed(2026)
    texts = {kind: sample(vocab, words, bias, generator)
             for kind, bias in [("genuine", mark), ("spoof", spoofer), ("human", None)]}
    detector = Detector(vocab=vocab, keyring=ring)
    return {kind: [detector.detect(vocab.tokenizer.decode(ids)) for ids in batch] for kind, batch in texts.items()}


def word_ids(vocab) -> torch.Tensor:
    """The toy world's vocabulary: WORDS single-token words (decode / re-tokenize stable)."""
    return torch.tensor(single_token_words(vocab, WORDS))


def sample(vocab, words: torch.Tensor, mark, generator) -> list[list[int]]:
    """TEXTS texts of LENGTH words: Zipf logits plus noise over the words (no other token is drawn), biased by
    ``mark`` through ``Watermark.bias``, the engine's call (None: unwatermarked)."""
    zipf = -1.1 * torch.log(torch.arange(1, words.shape[0] + 1, dtype=torch.float32))
    rows = [[int(words[int(torch.randint(0, 50, (1,), generator=generator))])] for _ in range(TEXTS)]
    bias = torch.zeros(TEXTS, vocab.vocab_size)
    for _ in range(LENGTH - 1):
        logits = zipf + 0.5 * torch.randn(TEXTS, words.shape[0], generator=generator)
        if mark is not None:  # the bias over the whole vocabulary, read at the words
            mark.bias(bias.zero_(), rows)
            logits += bias[:, words]
        drawn = torch.multinomial(torch.softmax(logits, dim=1), 1, generator=generator)[:, 0]
        for row, index in zip(rows, drawn.tolist()):
            row.append(int(words[index]))
    return rows


def at_most(n: int, rate: float, tail: float = 1e-4) -> int:
    """The largest count a Binomial(n, rate) exceeds with probability below ``tail``."""
    return int(stats.binom.isf(tail, n, rate))


def test_genuine_output_passes_both_halves_and_the_paired_test_holds_its_level(world):
    genuine = world["genuine"]
    assert sum(v.watermarked for v in genuine) >= TEXTS - 2
    reports = [v.public_half for v in genuine]
    assert all(r is not None and r["verdict"] == "watermarked" for r in reports)
    # exchangeable halves: the paired test's p-value is (super-)uniform on our own output
    p_values = [r["spoof_test"]["p_value"] for r in reports]
    assert sum(p <= SPOOF_ALPHA for p in p_values) <= at_most(TEXTS, SPOOF_ALPHA)
    assert sum(p <= 0.05 for p in p_values) <= at_most(TEXTS, 0.05)
    assert not any(v.to_dict()["spoof_suspected"] for v in genuine)


def test_a_spoof_steered_by_the_published_half_passes_it_and_is_caught_by_the_private_half(world):
    spoofs = world["spoof"]
    public_positive = [v for v in spoofs if v.public_half["verdict"] == "watermarked"]
    assert len(public_positive) >= TEXTS - 2  # the published half alone is spoofable: that is the point
    # the private half's colours are coins for the spoofer: its false-positive bound holds
    assert sum(v.watermarked for v in spoofs) <= at_most(TEXTS, 3.2e-5)
    caught = [v for v in public_positive if v.to_dict()["spoof_suspected"]]
    assert len(caught) >= len(public_positive) - 2
    # a detect-scope caller sees the bit (dithered like the verdict), not the counts behind it
    shown = [v.disclose("detect") for v in public_positive]
    assert all("public_half" not in d and d["verdict"] != "watermarked" for d in shown)
    assert sum(bool(d["spoof_suspected"]) for d in shown) >= len(public_positive) - 4
    assert all(v.disclose("explain")["public_half"]["spoof_test"]["public_only"] > 0 for v in public_positive)


def test_unwatermarked_text_is_neither_watermarked_nor_a_spoof(world):
    human = world["human"]
    assert sum(v.watermarked for v in human) <= at_most(TEXTS, 3.2e-5)
    assert sum(v.public_half["verdict"] == "watermarked" for v in human) <= at_most(TEXTS, 3.2e-5)
    assert not any(v.to_dict()["spoof_suspected"] for v in human)


# ------------------------------------------------------------------------------- the CLI
def test_cli_creates_exports_and_verifies_with_the_published_half(tmp_path, monkeypatch, capsys):
    from api.cli import main

    home = tmp_path / "home"
    monkeypatch.setenv("PROVMARK_HOME", str(home))
    monkeypatch.delenv("PROVMARK_MASTER_KEY", raising=False)

    def run(*argv):
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = run("keys", "create", KEY, "--public-half", "--json", "--no-progress")
    created = json.loads(out)
    assert code == 0 and created["public_half"] is True
    assert created["calibration"]["public_half"]["passes_screen"]  # both halves screened
    assert run("keys", "create", "plain", "--no-calibrate")[0] == 0
    code, _, err = run("keys", "create", "gum", "--spec", "gumbel:h=4", "--public-half", "--no-calibrate")
    assert code == 2 and "kgw" in err and all(k.key_id != "gum" for k in Keyring(home).list())
    assert "(two-part)" in run("keys", "list")[1]

    published = tmp_path / "published.json"
    assert run("keys", "export-public", KEY, "--out", str(published))[0] == 0
    text = published.read_text()
    secret = Keyring(home).secret(KEY)
    assert secret.hex() not in text and PublicKey.from_json(text).secret == public_half_secret(secret)
    assert PublicKey.from_json(text).calibration is not None
    code, _, err = run("keys", "export-public", "plain")
    assert code == 2 and "no public half" in err

    vocab = shared_vocabulary()
    mark = generation_watermark(None, vocab.vocab_size, KEY, Keyring(home))
    ids = sample(vocab, word_ids(vocab), mark, torch.Generator().manual_seed(1))[0]
    paste = tmp_path / "text.txt"
    paste.write_text(vocab.tokenizer.decode(ids))
    code, out, err = run("detect", str(paste), "--public-half", str(published), "--json")
    verdict = json.loads(out)
    assert "deprecated" not in err
    code, old_out, err = run("detect", str(paste), "--public-key", str(published), "--json")  # one release more
    assert code == 0 and json.loads(old_out)["verdict"] == verdict["verdict"] and "--public-half" in err
    assert code == 0 and verdict["verdict"] == "watermarked" and verdict["key_id"] == KEY
    assert verdict["public_half"] is None  # the published half alone is a plain key to its holder
    assert verdict["calibration"] is not None  # the published null guards the public verdict too
    code, out, _ = run("detect", str(paste), "--key", KEY)
    assert code == 0 and "public half" in out

    broken = tmp_path / "broken.json"
    broken.write_text(text.replace(PublicKey.from_json(text).fingerprint, "0" * 16))
    for bad, message in [(broken, "fingerprint"), (tmp_path / "missing.json", "cannot read")]:
        code, out, err = run("detect", str(paste), "--public-half", str(bad))
        assert code == 2 and message in err and out == ""
    code, _, err = run("detect", str(paste), "--public-half", str(published), "--key", KEY)
    assert code == 2 and "--key" in err


# ------------------------------------------------------------------------------- the detector service
def test_the_service_publishes_the_half_and_flags_spoofs_over_http(tmp_path):
    from http_fixtures import call, make_token, serve

    from api.detector.app import create_app
    from db.rows import VerdictRow
    from db.store import Store

    vocab = shared_vocabulary()
    ring = Keyring(tmp_path / "home")
    ring.create(KEY, secret=SECRET, public_half=True)
    ring.create("plain")
    store = Store(url=f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    app = create_app({"home": tmp_path / "home", "vocab": vocab, "store": store, "keyring": ring})
    explain, detect = make_token(store, "detect", "explain"), make_token(store, "detect")
    mark = generation_watermark(None, vocab.vocab_size, KEY, ring)
    generator = torch.Generator().manual_seed(11)
    with serve(app) as base_url:
        status, document, headers = call("GET", f"{base_url}/v1/keys/{KEY}/public-half")  # no token: it is public
        assert headers.get("Deprecation") is None
        status_old, old, headers = call("GET", f"{base_url}/v1/keys/{KEY}/public")  # the old path, one release more
        assert (status_old, old) == (status, document) and headers.get("Deprecation") == "true"
        assert status == 200 and PublicKey.from_json(json.dumps(document)).secret == public_half_secret(SECRET)
        assert SECRET.hex() not in json.dumps(document)
        for missing in ("plain", "nobody", "Not%20an%20id"):
            for path in ("public-half", "public"):
                status, body, _ = call("GET", f"{base_url}/v1/keys/{missing}/{path}")
                assert status == 404 and body["error"]["code"] == "key_not_found"
        spoofer = Watermark(mark.spec.with_(delta=SPOOF_DELTA), bytes.fromhex(document["detection_half"]),
                            vocab.vocab_size, "spoofer")
        spoof = vocab.tokenizer.decode(sample(vocab, word_ids(vocab), spoofer, generator)[0])
        status, full, _ = call("POST", base_url + "/v1/detect", {"text": spoof}, token=explain)
        assert status == 200 and full["verdict"] == "not_watermarked" and full["spoof_suspected"] is True
        assert full["public_half"]["verdict"] == "watermarked"
        status, shown, _ = call("POST", base_url + "/v1/detect", {"text": spoof}, token=detect)
        assert status == 200 and shown["spoof_suspected"] is True and "public_half" not in shown
    with store.read() as session:
        row = session.get(VerdictRow, full["id"])
    assert row.options["public_half"]["spoof_suspected"] is True  # the audit trail keeps the paired test


def test_detect_batch_workers_report_the_published_half_as_detect_does(tmp_path):
    from detector.batch import DetectOptions, prepare_jobs, run_local

    vocab = shared_vocabulary()
    ring = Keyring(tmp_path / "home")
    ring.create(KEY, secret=SECRET, public_half=True)
    spoofer = Watermark(generation_watermark(None, vocab.vocab_size, KEY, ring).spec.with_(delta=SPOOF_DELTA),
                        ring.public_half(KEY), vocab.vocab_size, "spoofer")
    texts = [vocab.tokenizer.decode(ids)
             for ids in sample(vocab, word_ids(vocab), spoofer, torch.Generator().manual_seed(5))[:3]]
    prepared = prepare_jobs([{"text": t} for t in texts], DetectOptions(), keyring=ring, vocab=vocab)
    assert SECRET.hex() not in repr(prepared.secrets)
    batch = run_local(prepared, workers=1)
    single = [Detector(vocab=vocab, keyring=ring).detect(t).to_dict() for t in texts]
    assert [v["public_half"] for v in batch] == [v["public_half"] for v in single]
    assert all(v["spoof_suspected"] is True for v in batch)


def test_eval_security_public_half_runs_on_the_real_model(tmp_path, loaded):
    from evaluation.public_half import PublicHalfConfig, run_public_half
    from evaluation.security_cli import wanted_attacks, wants_public_half

    assert wanted_attacks("public-half") == (False, ()) and wants_public_half("oracle, public-half")
    assert not wants_public_half("oracle") and wants_public_half("all")
    with pytest.raises(ValueError, match="spoof_delta"):
        PublicHalfConfig(spoof_deltas=(0.0,))
    results = run_public_half(PublicHalfConfig(texts=2, tokens=24, max_num_seqs=8), tmp_path, loaded, progress=False)
    sets = results["sets"]
    assert set(sets) == {"unwatermarked", "one_part", "two_part_delta_2", "two_part_delta_1.41", "spoof_delta_2",
                         "spoof_delta_4", "human"}
    assert all(section["24"]["n"] == 2 for section in sets.values())
    assert sets["spoof_delta_4"]["24"]["private_watermarked"] == 0.0  # the private half's colours are coins there
    assert (tmp_path / "results.json").exists() and (tmp_path / "public-half.png").stat().st_size > 0
