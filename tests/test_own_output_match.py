"""``matches_own_output`` (against scrubbing): the detector recognises the wording of an output the service
wrote under a key (``db.output_grams``) after edits that took its watermark away, and says so beside the
verdict without changing it; a remembered output it recognises gets its spoof check without itself, as the
check's null was made. Human text and output the service never wrote match nothing.

The toy world of ``test_spoof_on_verdicts`` (single-token words with Zipf frequencies) stands in for the model.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
import torch
from http_fixtures import call, make_token, serve, shared_vocabulary
from scipy import stats
from sqlalchemy import select
from test_spoof_on_verdicts import KEY, SPEC, as_text, keyed_memory, sample, world  # noqa: F401 - world is a fixture

from api.detector.app import create_app, services_of
from db.output_grams import GRAM, MIN_MATCHED, SAMPLE, GramIndex, Match, output_grams, text_grams
from db.output_memory import WARMUP, MemoryMirror, OutputMemory
from db.rows import KeyOutputRow, VerdictRow, utc_now
from db.store import Store
from detector import common_units
from detector.service import Detector
from detector.spoof_check import MIN_NULL, StoredCounts, spoof_check
from watermark.keys import Keyring

pytest_plugins = ["pg"]

EDIT_RATE = 0.2  # words replaced at random: a 5-gram survives with probability 0.8^5 = 0.33


def test_grams_are_keyed_sampled_and_leave_the_prompt_out():
    ids = np.random.default_rng(0).integers(0, 49152, size=2000)
    grams = text_grams(ids, 1)
    windows = ids.shape[0] - GRAM + 1
    low, high = stats.binom.interval(1 - 1e-9, windows, 1 / SAMPLE)  # one in SAMPLE kept, by hash
    assert low <= grams.size <= high
    assert (grams != 0).all() and (np.diff(grams) > 0).all()
    assert np.intersect1d(grams, text_grams(ids, 2)).size == 0  # another key names other n-grams
    assert set(text_grams(ids[100:150], 1).tolist()) <= set(grams.tolist())  # a 5-gram's name is where-free
    assert text_grams(ids[:GRAM - 1], 1).size == 0
    prompt = ids[:300]
    kept = output_grams(ids, prompt, 1)
    assert not np.isin(kept, text_grams(prompt, 1)).any()
    assert np.array_equal(kept, np.setdiff1d(grams, text_grams(prompt, 1)))


def test_an_index_names_the_one_output_a_text_repeats_and_not_shared_phrases():
    rng = np.random.default_rng(1)
    phrase = rng.integers(0, 49152, size=40)  # in every output: a phrase, not evidence
    outputs = [np.concatenate([rng.integers(0, 49152, size=160), phrase]) for _ in range(30)]
    index = GramIndex()
    for row, ids in enumerate(outputs):
        index.add(100 + row, text_grams(ids, 3))
    found = index.match(text_grams(outputs[7], 3))
    assert found.row == 107 and found.matches
    assert found.matched == np.setdiff1d(text_grams(outputs[7], 3), text_grams(phrase, 3)).size
    changed = outputs[7].copy()
    replaced = rng.random(changed.size) < EDIT_RATE
    changed[replaced] = rng.integers(0, 49152, size=int(replaced.sum()))
    assert index.match(text_grams(changed, 3)).row == 107
    shared = index.match(text_grams(phrase, 3))
    assert shared.matched == 0 and not shared.matches
    assert not index.match(text_grams(rng.integers(0, 49152, size=500), 3)).matches
    assert GramIndex().match(text_grams(outputs[0], 3)) is None  # nothing remembered: no answer
    assert index.match(text_grams(outputs[7][:GRAM - 1], 3)) == Match(-1, 0, 0)  # too short: an answer, no match
    assert Match(1, MIN_MATCHED, 20).matches and not Match(1, MIN_MATCHED - 1, 20).matches


def test_the_one_call_match_gives_the_numpy_paths_answer():
    """``GramIndex.match_ids`` (the C kernel the detector calls on every verdict: hashing, deduplication and
    both lookups at once) against ``match(numpy_grams(...))``: row 0, rows that tie (the smaller wins),
    texts that repeat a 5-gram, shared phrases, texts too short or with no owned n-gram, keys past 2^63."""
    from db.count_table import native_library
    from db.output_grams import numpy_grams

    if native_library() is None:
        pytest.skip("no C compiler: match_ids is the numpy path itself")
    rng = np.random.default_rng(7)
    key = (1 << 64) - 12345
    base = [rng.integers(0, 300, size=int(rng.integers(20, 400))) for _ in range(40)]  # a small vocabulary
    index = GramIndex()
    for row, ids in enumerate(base):
        index.add(row, numpy_grams(ids, key))
    tie = np.concatenate([base[3][:60], base[9][:60], base[3][:60]])  # repeats, and two outputs in one text
    texts = [*base, tie, base[0][:GRAM - 1], base[0][:GRAM], rng.integers(0, 300, size=800),
             rng.integers(0, 49152, size=2000), np.tile(base[5][:30], 8)]
    texts += [np.where(rng.random(t.size) < 0.3, rng.integers(0, 300, size=t.size), t) for t in base[:20]]
    answers = [(index.match_ids(t, key), index.match(numpy_grams(t, key))) for t in texts]
    for native, numpy in answers:
        assert native == numpy
    assert any(m.row == 0 and m.matches for m, _ in answers)  # row 0 is a row, not an empty slot
    a = rng.integers(1000, 2000, size=200)  # two outputs a text repeats equally: the smaller row wins
    b = next(b for b in (rng.integers(2000, 3000, size=200 + k % 40) for k in range(10_000))
             if numpy_grams(b, key).size == numpy_grams(a, key).size)
    pair = GramIndex()
    pair.add(8, numpy_grams(a, key))
    pair.add(5, numpy_grams(b, key))
    both = np.concatenate([a, b])
    assert pair.match_ids(both, key) == pair.match(numpy_grams(both, key))
    assert pair.match_ids(both, key).row == 5 and pair.match_ids(both, key).matched == numpy_grams(a, key).size
    assert sum(m.row == -1 for m, _ in answers) >= 2 and sum(m.matches for m, _ in answers) >= 30
    with pytest.raises(ValueError, match="row"):
        index.add(-1, numpy_grams(base[0], key))
    assert GramIndex().match_ids(base[0], key) is None


def test_the_scoring_kernels_match_is_the_indexs_own():
    """A ``MatchRequest`` run by the scoring kernel's call (``kgw_scores``: one crossing into C for the verdict)
    answers exactly what ``GramIndex.match_ids`` answers, for every kgw kernel (anchored and seeded schemes):
    matched and unmatched texts, repeats, texts shorter than an n-gram but scored; a request the kernel never
    ran (a text too short to score) answers None, and an index with nothing remembered makes no request."""
    from db.count_table import native_library
    from db.output_grams import numpy_grams
    from detector import scoring_kernel
    from watermark.scheme import make_watermark

    if native_library() is None or not scoring_kernel.available():
        pytest.skip("no C compiler: the index answers on its own")
    rng = np.random.default_rng(17)
    key = (1 << 64) - 777
    outputs = [rng.integers(0, 400, size=int(rng.integers(30, 300))) for _ in range(30)]
    index = GramIndex()
    for row, ids in enumerate(outputs):
        index.add(row, numpy_grams(ids, key))
    texts = [*outputs[:10], np.tile(outputs[2][:25], 6), rng.integers(0, 400, size=900), outputs[4][:GRAM - 1],
             np.concatenate([outputs[3][:80], outputs[8][:80]])]
    secret = hashlib.sha256(b"provmark-test/kernel-match").digest()
    answered = 0
    for spec in ("kgw:scheme=selfhash,h=4", "kgw:scheme=minhash,h=2", "kgw:scheme=lefthash,h=1",
                 "kgw:scheme=lefthash,h=3", "kgw:scheme=unigram"):
        mark = make_watermark(spec, secret, 49152, "k")
        for ids in texts:
            if ids.size <= mark.context_width:
                continue  # nothing to score: below
            request = index.match_request(key)
            assert request is not None and request.result() is None  # not run yet
            assert scoring_kernel.kgw_scores(mark, torch.from_numpy(ids), None, True, request) is not None
            assert request.result() == index.match_ids(ids, key)
            answered += 1
        short = index.match_request(key)
        assert scoring_kernel.kgw_scores(mark, torch.from_numpy(outputs[0][:mark.context_width]), None, True,
                                         short) is None
        assert short.result() is None  # the kernel returned before C: the caller asks the index
    assert answered == 5 * len(texts) - 1  # the 4-token text under h = 4
    assert sum(index.match_ids(t, key).matches for t in texts) >= 10
    assert GramIndex().match_request(key) is None  # nothing remembered: match_ids answers None

def edited(ids: list[int], words: torch.Tensor, rng: random.Random) -> list[int]:
    return [int(words[rng.randrange(len(words))]) if rng.random() < EDIT_RATE else i for i in ids]


def test_edited_output_matches_beside_the_verdict_and_is_spoof_checked_without_itself(tmp_path, world):  # noqa: F811
    vocab, words, _ = world
    # a fixed master key: the n-gram hash key (and which 5-grams are sampled) is derived from it
    keyring, mark, store, own, memory, info = keyed_memory(
        tmp_path, vocab, SPEC, b"provmark-test/own-output-match", hashlib.sha256(b"provmark-test/own-output-master").digest())
    generator = torch.Generator().manual_seed(11)
    outputs = [sample(world, mark, generator) for _ in range(WARMUP + MIN_NULL + 10)]
    for ids in outputs:
        own.remember(info, ids, vocab, as_text(world, ids))
    detector = Detector(vocab=vocab, keyring=keyring, output_memory=MemoryMirror(memory, sync_seconds=0.0))
    common = common_units.for_spec(mark.spec, vocab)

    for ids in outputs[-5:]:  # a remembered output as it was written: recognised, and checked without itself
        verdict = detector.detect(as_text(world, ids), keys=[KEY])
        assert verdict.watermarked and verdict.own_output["matched"] and verdict.to_dict()["matches_own_output"]
        alone = spoof_check(mark, torch.tensor(ids), common, StoredCounts(memory, KEY), leave_out=True)
        assert verdict.spoof_check["z"] == round(alone.z, 4) and verdict.spoof_check["units"] == alone.units
        counted_in = spoof_check(mark, torch.tensor(ids), common, StoredCounts(memory, KEY))
        assert counted_in.z > alone.z  # what the check said before: its own units counted as learnable

    rng = random.Random(5)
    scrubbed_texts = [as_text(world, edited(ids, words, rng)) for ids in outputs[:20]]
    scrubbed = [detector.detect(text, keys=[KEY]) for text in scrubbed_texts]
    # LENGTH 120 words: ~58 sampled 5-grams, 0.33 of them survive the edits (~19, sd ~4 with the overlaps):
    # below MIN_MATCHED = 8 is a 3-sd event; 18 of 20 leaves room for two
    kept = [v.own_output["grams_matched"] for v in scrubbed]
    assert sum(v.own_output["matched"] for v in scrubbed) >= 18 and 15 <= np.median(kept) <= 24, kept
    assert all(v.own_output["grams_matched"] < v.own_output["grams_in_text"] for v in scrubbed)

    fresh = [sample(world, mark, generator) for _ in range(20)]  # watermarked, never remembered
    plain = [sample(world, None, generator) for _ in range(20)]
    for ids in fresh + plain:
        verdict = detector.detect(as_text(world, ids), keys=[KEY])
        assert verdict.own_output["matched"] is False, verdict.own_output
        assert verdict.own_output["grams_matched"] < MIN_MATCHED // 2
    assert [detector.detect(as_text(world, ids), keys=[KEY]).verdict for ids in fresh].count("watermarked") == 20

    app = create_app({"home": tmp_path / "home", "vocab": vocab, "store": store, "keyring": keyring})
    token, detect_only = make_token(store, "detect", "explain"), make_token(store, "detect")
    text = next(t for t, v in zip(scrubbed_texts, scrubbed) if v.own_output["matched"])  # the service's view of it
    with serve(app) as base_url:
        def verdict(body_text, who):
            status, body, _ = call("POST", base_url + "/v1/detect", {"text": body_text, "keys": [KEY]}, token=who)
            assert status == 200, body
            return body

        shown, full = verdict(text, detect_only), verdict(text, token)
        human = verdict(as_text(world, plain[0]), detect_only)
    assert full["matches_own_output"] is True, full.get("own_output")
    assert shown["matches_own_output"] is True and "own_output" not in shown  # one bit for the detect scope
    assert full["matches_own_output"] is True and full["own_output"]["grams_matched"] >= MIN_MATCHED
    assert human["matches_own_output"] is False
    with services_of(app).store.read() as session:
        assert session.get(VerdictRow, full["id"]).options["own_output"] == full["own_output"]  # the audit trail
    store.close()


def test_a_detector_without_remembered_output_says_nothing(tmp_path, world):  # noqa: F811
    vocab = world[0]
    keyring = Keyring(tmp_path / "home")
    keyring.create(KEY, secret=bytes(32), spec=SPEC)
    store = Store(url=f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    text = as_text(world, sample(world, None, torch.Generator().manual_seed(2)))
    with_memory = Detector(vocab=vocab, keyring=keyring, output_memory=MemoryMirror(OutputMemory(store), 0.0))
    assert with_memory.detect(text, keys=[KEY]).to_dict()["matches_own_output"] is None
    assert Detector(vocab=vocab, keyring=keyring).detect(text, keys=[KEY]).own_output is None
    store.close()


def test_the_detectors_copy_indexes_each_outputs_grams_on_each_backend(database_url):
    """The n-grams a generation service writes reach a detector worker's index, at its first load and as it
    follows new rows; a row written without n-grams (before revision 0005) is in the counts, not the index."""
    store = Store(url=database_url)
    store.upgrade()
    memory = OutputMemory(store)
    mirror = MemoryMirror(memory, sync_seconds=0.0)
    rng = np.random.default_rng(3)
    texts = [rng.integers(0, 49152, size=200) for _ in range(12)]
    units = rng.integers(0, 2**64, size=50, dtype=np.uint64)
    for ids in texts[:6]:
        memory.record("k", units, 1.0, output_grams(ids, None, 42))
    view = mirror.view("k")
    with store.read() as session:
        rows = session.scalars(select(KeyOutputRow.id).where(KeyOutputRow.key_id == "k").order_by(KeyOutputRow.id)).all()
    assert [view.grams.match(text_grams(ids, 42)).row for ids in texts[:6]] == rows
    for ids in texts[6:]:
        memory.record("k", units, 1.0, output_grams(ids, None, 42))
    with store.write() as session:
        session.add(KeyOutputRow(key_id="k", outputs_before=12, z=0.5, units=units.view(np.int64).tobytes(),
                                 grams=None, created_at=utc_now()))
    view = mirror.view("k")
    assert all(view.grams.match(text_grams(ids, 42)).matches for ids in texts)
    assert view.grams.outputs == 12
    expected = np.sort(np.unique(units).view(np.int64))
    for ids in (texts[2], texts[9]):  # read at the first load (one query, then kept), and followed row by row
        row = view.grams.match(text_grams(ids, 42)).row
        assert np.array_equal(np.sort(memory.units_of(row)), expected)
        assert np.array_equal(np.sort(mirror.units_of("k", row)), expected)
        assert row in mirror.view("k").kept_units
    store.close()


def test_the_owner_table_names_one_owner_and_marks_shared_grams_in_c_and_numpy_alike():
    """``OwnerTable``: an n-gram reads as its one output's row + 1, as -1 once another output holds it too (the
    same output twice is still one), 0 when absent; an output that is mostly a copy of one earlier output leaves
    what that output holds to it. The C kernel and the numpy path agree with a plain model through growth."""
    from db.count_table import OwnerTable, native_library

    rng = np.random.default_rng(13)
    outputs = [np.unique(rng.integers(1, 8000, size=int(rng.integers(1, 900)), dtype=np.int64)) for _ in range(12)]
    outputs += [np.unique(np.concatenate([outputs[2], [8001, 8002]])), outputs[5][: outputs[5].size // 3]]
    rows = [*range(12), 20, 21, 3]  # the last: output 3 again under its own row
    outputs.append(outputs[3])
    model: dict[int, int] = {}  # n-gram -> row + 1, or -1
    for row, grams in zip(rows, outputs):
        held = [model[g] for g in grams.tolist() if model.get(g, 0) > 0]
        owners, counts = np.unique(held, return_counts=True) if held else ([], [])
        keep = int(owners[np.argmax(counts)]) if held and 2 * max(counts) >= grams.size else 0
        for g in grams.tolist():
            if g not in model:
                model[g] = row + 1
            elif model[g] not in (row + 1, keep):
                model[g] = -1
    tables = [OwnerTable(native=False)] + ([OwnerTable()] if native_library() is not None else [])
    for table in tables:
        for row, grams in zip(rows, outputs):
            table.add_owner(grams, row)
    probe = np.arange(0, 8100, dtype=np.int64)
    expected = np.array([model.get(g, 0) for g in probe.tolist()], dtype=float)
    # the copies left their originals' n-grams to them and own only what they added
    assert (expected == 21).sum() == 2 and (expected == 22).sum() == 0 and (expected == 3).sum() > 0
    assert (expected == -1).sum() > 0 and (expected == 4).sum() > 0
    for table in tables:
        assert table.bits > 10  # it grew past its first allocation
        assert np.array_equal(table.counts(probe), expected)
    with pytest.raises(TypeError):
        tables[0].add(probe)


def test_an_output_generated_twice_or_continued_is_still_recognised():
    """Greedy decoding, or a seeded request sent again, writes the same output twice; a longer request with the
    same seed writes it again with more after it. Before, the copies made every n-gram of the original "shared",
    so neither it nor a scrubbed copy matched: one extra generation hid an output from the match."""
    rng = np.random.default_rng(14)
    original = rng.integers(0, 49152, size=200)
    longer = np.concatenate([original, rng.integers(0, 49152, size=60)])
    other = rng.integers(0, 49152, size=200)
    index = GramIndex()
    index.add(1, text_grams(original, 9))
    index.add(2, text_grams(other, 9))
    index.add(3, text_grams(original, 9))  # the same output again
    index.add(4, text_grams(longer, 9))  # and continued
    scrubbed = original.copy()
    replaced = rng.random(scrubbed.size) < EDIT_RATE
    scrubbed[replaced] = rng.integers(0, 49152, size=int(replaced.sum()))
    for text in (original, scrubbed):
        found = index.match_ids(text, 9)
        assert found.matches and found.row == 1
    tail = index.match_ids(longer[200:], 9)  # the continuation's own wording is the continuation's
    assert tail.matches and tail.row == 4
    assert index.match_ids(other, 9).row == 2
    window = GramIndex(capacity=2)  # a rebuild replays the outputs in order: the same answers
    for row, ids in ((1, original), (2, other), (3, original), (4, longer)):
        window.add(row, text_grams(ids, 9))
    assert window.match_ids(original, 9).matches and window.match_ids(original, 9).row == 3  # the older copy kept


def test_an_index_with_a_capacity_answers_for_its_newest_outputs_and_stays_bounded():
    """A detector worker keeps each key's index for as long as it runs: with ``capacity`` C it answers for at
    least the newest C outputs and never for more than C + C/4, exactly as an index of those outputs alone
    would, and its tables stop growing (the service's own output, or a client generating for the purpose,
    cannot grow a worker's memory without bound)."""
    rng = np.random.default_rng(11)
    capacity, key = 40, 5
    outputs = [rng.integers(0, 49152, size=200) for _ in range(300)]
    index = GramIndex(capacity)
    slots = []
    for row, ids in enumerate(outputs):
        index.add(row, text_grams(ids, key))
        slots.append(index.table.bits)
        assert capacity <= index.outputs <= capacity + capacity // 4 or row < capacity
        if row in (60, 299):
            newest = range(row + 1 - index.outputs, row + 1)
            alone = GramIndex()
            for kept in newest:
                alone.add(kept, text_grams(outputs[kept], key))
            for probe in [*range(0, row + 1, 7), *newest[-capacity:]]:
                assert index.match_ids(outputs[probe], key) == alone.match_ids(outputs[probe], key)
                assert index.match_ids(outputs[probe], key).matches == (probe in newest)
    assert max(slots[100:]) == max(slots[50:100])  # the tables stopped growing once the window filled
    assert GramIndex(0).match_ids(outputs[0], key) is None  # capacity 0: nothing remembered
    index_zero = GramIndex(0)
    index_zero.add(1, text_grams(outputs[1], key))
    assert index_zero.outputs == 0 and index_zero.match_ids(outputs[1], key) is None
    with pytest.raises(ValueError, match="capacity"):
        GramIndex(-1)


def test_a_worker_loads_and_follows_only_its_window_of_outputs(database_url, tmp_path):
    """``PROVMARK_REMEMBERED_OUTPUTS`` reaches the detector worker's copy: at its first load it reads the newest
    outputs' n-grams only, and as it follows new rows the oldest leave the window; a bad value is refused."""
    from api.settings import Settings

    store = Store(url=database_url)
    store.upgrade()
    memory = OutputMemory(store)
    rng = np.random.default_rng(12)
    texts = [rng.integers(0, 49152, size=200) for _ in range(30)]
    units = rng.integers(0, 2**64, size=50, dtype=np.uint64)
    for ids in texts[:10]:
        memory.record("k", units, 1.0, output_grams(ids, None, 42))
    mirror = MemoryMirror(memory, sync_seconds=0.0, grams_kept=4)
    view = mirror.view("k")
    assert [view.grams.match(text_grams(ids, 42)).matches for ids in texts[:10]] == [False] * 6 + [True] * 4
    for ids in texts[10:]:
        memory.record("k", units, 1.0, output_grams(ids, None, 42))
    view = mirror.view("k")
    matched = [view.grams.match(text_grams(ids, 42)).matches for ids in texts]
    assert matched[-4:] == [True] * 4 and not any(matched[:25]) and view.grams.outputs <= 5
    assert MemoryMirror(memory, 0.0, grams_kept=None).view("k").grams.outputs == 30
    store.close()
    assert Settings(home=tmp_path, remembered_outputs="7").remembered_outputs == 7
    with pytest.raises(ValueError, match="PROVMARK_REMEMBERED_OUTPUTS"):
        Settings(home=tmp_path, remembered_outputs=-1)
    app = create_app({"home": tmp_path / "home", "vocab": shared_vocabulary(), "remembered_outputs": 7,
                      "database_url": f"sqlite:///{tmp_path / 'app.db'}"})
    assert services_of(app).detector.output_memory.grams_kept == 7  # the service's workers take the setting
    services_of(app).store.close()


def test_the_security_evaluation_counts_scrubbed_output_the_memory_recognises():
    """``eval security``'s scrubbing and control sections (``evaluation.attack_measures.remembered``): the
    key's outputs, training and held out, are remembered without their prompts' wording; an edited held-out
    output matches, text the service never wrote does not, and a text detected or matched counts once."""
    from types import SimpleNamespace

    from evaluation.attack_measures import _summary, remembered

    rng = random.Random(4)
    words = [f"w{i}" for i in range(5000)]

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    def encode(body: str) -> list[int]:
        return [words.index(w) for w in body.split()]

    prompt = text(30)

    def generation(body: str) -> SimpleNamespace:
        return SimpleNamespace(text=body, prompt_ids=encode(prompt))

    run = SimpleNamespace(training_texts=lambda: {"k": [generation(text(150)) for _ in range(40)]}, encode=encode)
    held = {"k": [generation(text(150)) for _ in range(5)] + [generation(prompt + " " + text(150))]}
    matches = remembered(run, "k", held)
    scrubbed = [" ".join(rng.choice(words) if rng.random() < EDIT_RATE else w for w in g.text.split())
                for g in held["k"]]
    assert matches(scrubbed) == [True] * 6
    assert matches([text(150), prompt, prompt + " " + text(40)]) == [False] * 3  # the prompt's wording is not ours
    summary = _summary([{"z": 5.0, "detected": True}, {"z": 1.0, "detected": False}, {"z": 0.0, "detected": False}],
                       [True, True, False])
    assert summary["success_rate"] == pytest.approx(1 / 3) and summary["matches_own_output"] == pytest.approx(2 / 3)
    assert summary["detected_or_matched"] == pytest.approx(2 / 3)
    assert "matches_own_output" not in _summary([{"z": 5.0, "detected": True}])
