"""``paraphrase_of_own_output``: a text that restates a remembered output in other words is recognised beside the
verdict (never changing it), an unrelated human text is not; the generation side's hook writes the signature the
detector looks up; the detect scope sees one bit, explain the receipt id, similarity and false-match rate, over
HTTP and in ``/v1/matches/byContent``; the shipped calibration holds on held-out human text the fit never saw."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from http_fixtures import call, make_token, serve, shared_vocabulary
from sqlalchemy import select

from api.detector.app import create_app
from api.generation.own_output import OwnOutput
from db.manifests import ManifestRecord, add_manifest
from db.passage_signature import similarity
from db.passage_words import fitted_words
from db.rows import OutputVectorRow
from db.semantic_memory import SemanticMemory, SignatureMirror
from db.signature_index import SignatureIndex
from db.store import Store
from detector.human_corpora import HELD_OUT
from detector.paraphrase_match import ParaphraseNull, shipped_null
from detector.service import Detector
from evaluation.own_output_layers import OwnOutputLayers
from evaluation.paraphrase_calibration import passages, quoted_pairs
from evaluation.paraphrase_words import best_of, signatures, word_similarities
from generation.sequence import WatermarkInfo
from watermark.keys import Keyring
from watermark.scheme import make_watermark
from watermark.vocab import encode

KEY, SPEC = "meaning", "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0,code_delta=3.5,prf=hmac-sha256"  # the default
ORIGINAL = (
    "The city council voted on Tuesday night to close the old public library on Main Street and move its books to a "
    "new building near the train station. Supporters of the plan said the new site would be easier for commuters to "
    "reach and would cost less to heat and repair. Several residents spoke against the move, saying the old library "
    "was a landmark that had served the neighbourhood for more than a hundred years. The mayor promised that the "
    "historic building would not be torn down and that a committee would decide how it could be used in the future. "
    "Construction of the new library is expected to begin next spring and to take about two years.")
PARAPHRASE = (  # written by hand: hardly a 5-gram in common
    "On Tuesday evening, members of the municipal council approved shutting the aging Main Street library and "
    "relocating its collection to a fresh facility close to the railway station. Backers argued that people "
    "travelling to work could get to the new location more easily, and that heating and maintaining it would be "
    "cheaper. A number of locals objected, calling the century-old library a neighbourhood landmark. The mayor "
    "pledged that the historic structure would be preserved and that a panel would choose its future purpose. Work "
    "on the replacement library should start next spring and last roughly two years.")
OTHERS = (
    "Heavy rain fell across the region over the weekend, flooding several roads and forcing the closure of two "
    "schools. Forecasters expect drier weather by Wednesday, although strong winds may continue along the coast. "
    "Emergency services urged drivers to avoid travelling unless necessary and to watch out for fallen trees.",
    "The new graphics card delivers twice the frame rate of its predecessor while drawing less power, and reviewers "
    "praised its quiet fans, although its price puts it out of reach for many players building their first machine.",
)
# two outputs of the embedded model, in Hebrew letters, that say nothing in common (it wrote them continuing two
# different news articles at temperature 1): they share the script's tokens, not one word
SAME_SCRIPT = (
    "עם המפייצון-עם הומעיא-יפזם-העישום-משמיעים -עם-מביעותי חוזקיקפסכככככככ-יביבב-עגרנבדכככככככככככככ-יחקשטעבחלערללחשסין"
    "-עם-ישום-ישום-ישום-ישושם-מהיצאיׯ-שו",
    "עכל:םפת לעדם העצב הייכקאם –עכל\nלאחר:סוגריוחם –עצברEditידעוברימי (עינייתקוק למעולם)\nחמירות עצבר - אמפёןעבקמגואל "
    "(קובקישiדביבזמם)\nאסחוט פוערי הסכתי בטלולעספלעפלמעכ",
)
HUMAN = (  # unrelated human text: a recipe
    "Preheat the oven to 180 degrees. Beat the butter and sugar together until pale, then add the eggs one at a "
    "time, mixing well after each. Fold in the flour and a pinch of salt, pour the batter into a lined tin and bake "
    "for forty minutes, until a skewer pushed into the middle comes out clean. Leave it to cool before icing.")


@pytest.fixture
def remembered(tmp_path):
    vocab, keyring, store = remember_texts(tmp_path)
    yield vocab, keyring, store
    store.close()


def remember_texts(tmp_path) -> tuple:
    """(The vocabulary, a keyring with KEY, a SQLite store) with ORIGINAL and OTHERS remembered through the
    generation side's hook (receipts r-0, r-1, r-2)."""
    vocab = shared_vocabulary()
    keyring = Keyring(tmp_path / "home", master_key=hashlib.sha256(b"provmark-test/paraphrase").digest())
    keyring.create(KEY, secret=hashlib.sha256(b"provmark-test/paraphrase-key").digest(), spec=SPEC)
    mark = make_watermark(SPEC, keyring.secret(KEY), vocab.vocab_size, KEY)
    store = Store(url=f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    own = OwnOutput(store, keyring, SemanticMemory(store))
    info = WatermarkInfo(mark.spec.format(), KEY, mark.fingerprint)
    for i, text in enumerate((ORIGINAL, *OTHERS)):
        own.remember(info, encode(vocab, text), vocab, text, receipt_id=f"r-{i}")
    return vocab, keyring, store


def test_a_paraphrase_is_recognised_and_unrelated_human_text_is_not(remembered):
    vocab, keyring, store = remembered
    memory = SemanticMemory(store)
    assert memory.count(KEY) == 3
    with store.read() as session:  # what the generation side wrote: a signature per output, no vector, no text
        rows = session.execute(select(OutputVectorRow.vector, OutputVectorRow.signature)).all()
    assert all(vector is None and signature and ORIGINAL[:40].encode() not in signature for vector, signature in rows)
    detector = Detector(vocab=vocab, keyring=keyring, semantic_memory=SignatureMirror(memory, sync_seconds=0.0))
    plain = Detector(vocab=vocab, keyring=keyring)
    found = detector.detect(PARAPHRASE, keys=[KEY])
    fact = found.paraphrase_of_own_output
    assert fact["matched"] and fact["receipt_id"] == "r-0" and fact["key_id"] == KEY, fact
    assert fact["similarity"] >= fact["threshold"] and fact["outputs_searched"] == 3
    rate = 3 * shipped_null().pair_rate(fact["similarity"], ("human",))  # three outputs searched; rounded up
    assert rate <= fact["false_match_rate"] <= rate * 1.1
    other = min(1.0, 3 * shipped_null().pair_rate(fact["similarity"], ("outputs",)))  # a wrong receipt's rate
    assert other <= fact["other_output_rate"] <= other * 1.1
    assert found.verdict == plain.detect(PARAPHRASE, keys=[KEY]).verdict  # the verdict is the watermark's alone
    assert found.own_output is None  # no 5-gram memory here; the paraphrase shares few 5-grams anyway
    for text in (HUMAN, *passages(HELD_OUT)[0][:200:20]):
        fact = detector.detect(text, keys=[KEY]).paraphrase_of_own_output
        assert fact["matched"] is False and fact["receipt_id"] is None and fact["key_id"] is None, fact
    assert plain.detect(PARAPHRASE, keys=[KEY]).paraphrase_of_own_output is None


def test_the_scopes_see_one_bit_or_the_fact_over_http_and_by_content(remembered, tmp_path):
    vocab, keyring, store = remembered
    with store.write() as session:
        add_manifest(session, ManifestRecord("urn:uuid:paraphrased", "r-0", "0" * 64, False, None, b"store"), "test")
    app = create_app({"home": tmp_path / "home", "vocab": vocab, "store": store, "keyring": keyring})
    full_token, detect_token = make_token(store, "detect", "explain"), make_token(store, "detect")
    with serve(app) as base:
        def detect(text, token):
            status, body, _ = call("POST", base + "/v1/detect", {"text": text, "keys": [KEY]}, token=token)
            assert status == 200, body
            return body["paraphrase_of_own_output"]

        assert detect(PARAPHRASE, detect_token) == {"matched": True}
        full = detect(PARAPHRASE, full_token)
        assert full["matched"] and full["receipt_id"] == "r-0" and 0 < full["false_match_rate"] <= 1
        assert detect(HUMAN, detect_token) == {"matched": False}
        assert detect(HUMAN, full_token)["receipt_id"] is None
        by_content = {}
        for name, token in (("explain", full_token), ("detect", detect_token)):
            status, by_content[name], _ = call("POST", base + "/v1/matches/byContent", raw=PARAPHRASE.encode(),
                                               token=token, headers={"Content-Type": "text/plain"})
            assert status == 200, by_content[name]
    score = by_content["explain"]["matches"][0]
    assert score["manifestId"] == "urn:uuid:paraphrased" and 1 <= score["similarityScore"] <= 99
    assert by_content["detect"]["matches"] == []  # no similarity oracle for the detect scope


def test_a_memory_turned_off_says_nothing(remembered, tmp_path):
    vocab, keyring, store = remembered
    app = create_app({"home": tmp_path / "home", "vocab": vocab, "store": store, "keyring": keyring,
                      "semantic_outputs": 0})
    token = make_token(store, "detect", "explain")
    with serve(app) as base:
        status, body, _ = call("POST", base + "/v1/detect", {"text": PARAPHRASE, "keys": [KEY]}, token=token)
    assert status == 200 and body["paraphrase_of_own_output"] is None


def test_the_shipped_calibration_holds_on_held_out_human_text():
    """The threshold was fitted on the fit half; held-out passages (every 4th, ~2,500) against a memory of 40 outputs
    of the embedded model (``paraphrase_outputs.json``) and the test's own, looked up as a verdict looks them up
    (the highest words similarity to any of them), never reach it."""
    null = shipped_null()
    vocab = shared_vocabulary()
    outputs = json.loads((Path(__file__).with_name("paraphrase_outputs.json")).read_text())["outputs"]
    memory = [encode(vocab, t)[:200] for t in (ORIGINAL, *OTHERS, *outputs)]
    held = [encode(vocab, t)[:200] for t in passages(HELD_OUT)[0][::4]]
    words = word_similarities(signatures(vocab, held), signatures(vocab, memory))
    best, _ = best_of(words)
    assert len(held) > 2000 and int((best >= null.threshold).sum()) == 0, np.sort(best)[-5:]
    assert words.max() < 1.0 and np.median(best) > 0  # most passages share some stem with an output
    assert null.false_match_rate(null.threshold, 1) <= 1e-4 * 10  # one pair at the threshold: rare
    assert null.false_match_rate(1.0, 10**9) == 1.0 and null.pair_rate(-1.0) == 1.0


def test_a_calibration_file_is_checked():
    with pytest.raises(ValueError, match="ascending"):
        ParaphraseNull.from_dict({"grid": [0.5, 0.2], "nulls": {}, "threshold": 0.9})
    with pytest.raises(ValueError, match="one exceedance"):
        ParaphraseNull.from_dict({"grid": [0.1], "nulls": {"h": {"pairs": 1, "exceed": []}}, "threshold": 0.9})
    assert json.loads(json.dumps(shipped_null().summary()))["human"]["texts"] >= 10_000


def test_outputs_in_one_script_that_share_no_word_are_not_matched():
    """The words are read as words, not the script's byte-level tokens: two unrelated outputs in Hebrew letters stay
    below the threshold (with tokens they were at 0.90, and an unrelated output was named as the source)."""
    vocab = shared_vocabulary()
    a, b = signatures(vocab, [encode(vocab, text) for text in SAME_SCRIPT])
    assert similarity(a, b) < shipped_null().threshold


def test_the_fitted_stems_serve_every_vocabulary():
    """Signatures read stems from the text, so a model whose tokenizer the stems were not fitted with still weighs
    them by the shipped frequencies: the commonest weigh least, a stem never seen the most."""
    words = fitted_words()
    assert len(words.index) > 10_000 and words.unseen_idf > float(words.idf.max())
    common, rare = (float(words.idf[words.index[stem]]) for stem in ("the", "librar"))
    assert common < rare


def test_a_passage_whose_document_a_prompt_quotes_is_left_out_of_the_human_null():
    vocab = shared_vocabulary()
    prompt = encode(vocab, "Continue the article: " + ORIGINAL.split(". ")[0] + ".")
    outputs = [{"text": PARAPHRASE, "prompt": "p1", "prompt_ids": prompt},
               {"text": OTHERS[0], "prompt": "p2", "prompt_ids": encode(vocab, "Write about the weather.")}]
    texts = [ORIGINAL, "A later passage of the same article, quoting nothing of the prompt.", HUMAN]
    quoted = quoted_pairs(vocab, texts, [0, 0, 1], outputs)
    assert quoted.tolist() == [[True, False], [True, False], [False, False]]


def test_a_lookup_past_its_budget_compares_its_candidates_exactly(remembered, monkeypatch):
    """A text whose stems' postings exceed the budget (a long text against many outputs) is scored on its rarest
    stems first; its best candidates are then compared exactly from the stored signatures: the fact is the same."""
    vocab, keyring, store = remembered
    detector = Detector(vocab=vocab, keyring=keyring,
                        semantic_memory=SignatureMirror(SemanticMemory(store), sync_seconds=0.0))
    exact = detector.detect(PARAPHRASE, keys=[KEY]).paraphrase_of_own_output
    best, seen = SignatureIndex.best, []

    def on_a_budget(index, query, count, max_postings=None):
        found = best(index, query, count, max_postings=3)
        seen.append(found.exact)
        return found

    monkeypatch.setattr(SignatureIndex, "best", on_a_budget)
    partial = detector.detect(PARAPHRASE, keys=[KEY]).paraphrase_of_own_output
    assert seen == [False] and partial == exact and exact["matched"] and exact["receipt_id"] == "r-0"


def test_the_robustness_runs_layers_recognise_a_paraphrase_the_5_gram_match_misses():
    outputs = json.loads((Path(__file__).with_name("paraphrase_outputs.json")).read_text())["outputs"]
    generations = [SimpleNamespace(text=t, prompt_ids=[]) for t in (ORIGINAL, *OTHERS, *outputs[:20])]
    layers = OwnOutputLayers(shared_vocabulary(), generations)
    assert layers.thresholds["0.0001"] is not None
    clean = layers.measure([g.text for g in generations], [9.0] * len(generations), {"0.001": 3.1, "0.0001": 3.7})
    assert clean["at_fmr"]["0.0001"] == {**clean["at_fmr"]["0.0001"], "watermark": 1.0, "semantic": 1.0, "any": 1.0}
    attacked = [PARAPHRASE, HUMAN, *[g.text for g in generations[2:]]]  # output 1 replaced by unrelated text
    found = layers.measure(attacked, [None] * len(attacked), {"0.0001": 3.7})["at_fmr"]["0.0001"]
    n = len(attacked)
    assert found["semantic"] == (n - 1) / n and found["watermark"] == 0.0  # all but the replaced one
    assert found["five_gram"] <= (n - 2) / n  # the hand paraphrase shares too few 5-grams
