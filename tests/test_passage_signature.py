"""What the semantic memory keeps of an output's words (``db.passage_signature``): keyed hashes and counts, no
text and no weight; the same on every worker that holds the master key, other hashes under another key; the
commonest stems left out; the exact cosine the semantic match decides on; and a row written before signatures is
never named."""

from __future__ import annotations

import hashlib

import numpy as np
from test_paraphrase_match import KEY, ORIGINAL, OTHERS, PARAPHRASE, remember_texts

from db.passage_signature import (
    MIN_IDF,
    Parsed,
    parse,
    shipped_words,
    signature,
    signature_key,
    similarity,
    stem_key,
    text_signature,
    text_signature_bytes,
)
from db.passage_words import COUNT_CAP, fitted_words, stems
from db.rows import OutputVectorRow
from db.semantic_memory import SemanticMemory, SignatureMirror
from detector.service import Detector
from watermark.keys import Keyring

K1, K2 = hashlib.sha256(b"provmark-test/k1").digest(), hashlib.sha256(b"provmark-test/k2").digest()


def test_the_signature_holds_keyed_hashes_and_counts_only():
    words = fitted_words()
    blob = signature(ORIGINAL, words, stem_key(K1, words))
    kept = {s for s in stems(ORIGINAL) if s in words.index and float(words.idf[words.index[s]]) >= MIN_IDF}
    assert len(blob) == 5 * len(kept) and len(kept) > 20  # 4 bytes of hash and 1 of count per kept stem
    for word in ("librar", "council", "station", "the"):
        assert word.encode() not in blob
    hashes = np.frombuffer(blob[:4 * len(kept)], dtype="<u4")
    assert np.all(np.diff(hashes.astype(np.int64)) > 0)  # sorted and unique: the text's word order is not kept
    assert "the" not in kept and "and" not in kept  # the commonest stems are left out
    counts = np.frombuffer(blob[4 * len(kept):], dtype="u1")
    assert counts.min() == counts.max() == COUNT_CAP == 1  # whether the text uses a stem, not how often


def test_one_key_gives_one_signature_and_another_key_other_hashes(tmp_path):
    words = fitted_words()
    a = signature(ORIGINAL, words, stem_key(K1, words))
    assert a == signature(ORIGINAL, words, stem_key(K1, words))
    b = signature(ORIGINAL, words, stem_key(K2, words))
    n = len(a) // 5
    assert len(b) == len(a) and not set(np.frombuffer(a[:4 * n], "<u4")) & set(np.frombuffer(b[:4 * n], "<u4"))
    derived = [signature_key(Keyring(tmp_path / name, master_key=k)) for name, k in (("a", K1), ("b", K1), ("c", K2))]
    assert derived[0] == derived[1] != derived[2] and len(derived[0]) == 32


def test_the_similarity_is_the_exact_cosine_of_the_weighted_stems():
    words = fitted_words()
    key = stem_key(K1, words)
    one, para, other = (parse(signature(t, words, key), key) for t in (ORIGINAL, PARAPHRASE, OTHERS[0]))
    assert abs(similarity(one, one) - 1.0) < 1e-9
    assert similarity(one, para) == similarity(para, one) > 0.2 > similarity(one, other)
    # by hand: shared stems' weights (1 + log count, each stem counted once) x idf, over both norms
    def weights(text):
        counted = {}
        for s in stems(text):
            row = words.index.get(s)
            idf = words.unseen_idf if row is None else float(words.idf[row])
            if idf >= MIN_IDF:
                counted[s] = (min(COUNT_CAP, counted.get(s, (0, 0))[0] + 1), idf)
        return {s: (1 + np.log(c)) * idf for s, (c, idf) in counted.items()}
    wa, wb = weights(ORIGINAL), weights(PARAPHRASE)
    dot = sum(wa[s] * wb[s] for s in wa.keys() & wb.keys())
    expected = dot / (np.linalg.norm(list(wa.values())) * np.linalg.norm(list(wb.values())))
    assert abs(similarity(one, para) - expected) < 1e-6
    old = signature(ORIGINAL, words, key)  # a row written when a stem counted up to 3 times reads as counted once
    n = len(old) // 5
    assert similarity(parse(old[:4 * n] + bytes([3]) * n, key), one) > 1 - 1e-9
    empty = parse(b"", key)
    assert similarity(empty, one) == 0.0 and parse(b"\x00" * 7, key).hashes.size == 0  # malformed: empty
    assert isinstance(empty, Parsed)


def test_both_services_read_the_same_signature_from_the_text():
    """The generation service stores the signature of the text the detector will read (its normalised text); the
    detector compares the same stems under the same key, parsed without the bytes."""
    words = shipped_words()
    stored = text_signature_bytes(ORIGINAL, K1)
    assert stored == signature(ORIGINAL, words, stem_key(K1, words))
    read = text_signature(ORIGINAL, words, stem_key(K1, words))
    assert np.array_equal(read.hashes, parse(stored, stem_key(K1, words)).hashes)
    assert abs(similarity(read, parse(stored, stem_key(K1, words))) - 1.0) < 1e-9


def test_a_row_without_a_signature_is_never_named(tmp_path):
    """Rows from before revision 0013 keep their vector and no signature: nothing reads them, so no receipt is
    named, even for the output's own text; a row with one is."""
    vocab, keyring, store = remember_texts(tmp_path)
    try:
        memory = SemanticMemory(store)
        old_key = "old"
        keyring.create(old_key, secret=hashlib.sha256(b"provmark-test/old").digest())
        with store.write() as session:
            session.add(OutputVectorRow(key_id=old_key, receipt_id="r-old", vector=bytes(512), form=3))
        detector = Detector(vocab=vocab, keyring=keyring, semantic_memory=SignatureMirror(memory, sync_seconds=0.0))
        assert detector.detect(ORIGINAL, keys=[old_key]).paraphrase_of_own_output is None  # nothing to search
        new = detector.detect(ORIGINAL, keys=[KEY]).paraphrase_of_own_output
        assert new["matched"] and new["receipt_id"] == "r-0" and new["similarity"] > 0.99
    finally:
        store.close()


def test_the_fast_stems_are_the_patterns():
    """``stems`` cuts ASCII words with bytes.translate and takes the pattern for pieces with other characters:
    the same stems as ``STEM.findall(text.lower())``, on every ASCII character, mixed scripts and a final sigma."""
    import random  # noqa: PLC0415 (this test only)

    from db.passage_words import STEM  # noqa: PLC0415 (this test only)

    texts = ["".join(chr(i) for i in range(128)) * 3, "Café naïve—déjà vu: ΟΔΟΣ. ΣΟΦΟΣ'Α x\u00a0y ıİß Straße",
             ORIGINAL, PARAPHRASE, *OTHERS]
    rng = random.Random(0)
    texts += ["".join(rng.choice("aÉ_9 -—’ıİßΣσς\u00a0\u2003x.Z'\t") for _ in range(500)) for _ in range(50)]
    for text in texts:
        assert stems(text) == STEM.findall(text.lower()), text


def test_the_stem_kernel_reads_what_the_pattern_reads(monkeypatch):
    """``stem_counts`` in C and in Python (no compiler, or PROVMARK_NATIVE=0) give the same fitted rows, counts and
    stems not fitted, on ASCII, mixed scripts, words the fit never saw and a capital sigma, with every row kept
    and with only some."""
    import random  # noqa: PLC0415 (this test only)

    from db import passage_words  # noqa: PLC0415 (this test only)

    assert passage_words._library() is not None  # the kernel is what is checked (CI has a compiler)
    words = fitted_words()
    rng = random.Random(2)
    texts = [ORIGINAL, PARAPHRASE, "Zyxwvut qqqqqqqq __init__ 1234567 Ünïcödé café—déjà", "ΣΟΦΟΣ the library", ""]
    texts += ["".join(rng.choice("aÉ_9 -—’ıİßσςAbCdeFGhij\u00a0x.Z'\t\n") for _ in range(600)) for _ in range(30)]
    texts += ["the the The THE tHe " * 100 + ORIGINAL]  # a count past 255 is read as 255
    everything, some = np.ones(len(words.idf), bool), np.arange(len(words.idf)) % 3 > 0
    native = [passage_words.stem_counts(text, words, kept) for kept in (everything, some) for text in texts]
    monkeypatch.setattr(passage_words, "_library", lambda: None)
    python = [passage_words.stem_counts(text, words, kept) for kept in (everything, some) for text in texts]
    for (rows, counts, others), (python_rows, python_counts, python_others) in zip(native, python):
        assert len(set(rows.tolist())) == len(rows)
        assert dict(zip(rows.tolist(), counts.tolist())) == dict(zip(python_rows.tolist(), python_counts.tolist()))
        assert sorted(others) == sorted(python_others)
    assert len(native[2][2]) >= 2  # words the fit never saw are returned as stems
    assert max(native[len(texts) - 1][1]) == 255 and some[np.concatenate([r for r, _, _ in native[len(texts):]])].all()
