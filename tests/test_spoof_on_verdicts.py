"""The spoof check on verdicts, end to end without a model: the generation service's memory of
its own output (``db.output_memory``, on SQLite and PostgreSQL), filled by the generation side's hook
(``api.generation.own_output``), read by the detector service for every positive verdict of a KGW, gumbel:
or synthid: key.

A toy world over single-token words with Zipf frequencies stands in for the model: the service's outputs
are sampled with the key's bias (``Watermark.bias``) or its keyed sampler (gumbel's race, synthid's
tournament; plain sampling on a context seen before in the text, as generation-time dedup does); a thief
who read them knows the colour (KGW) or the score (gumbel, synthid) of every bigram it saw at least twice
(an upper bound on what stealing estimates, docs/security.md) and steers an unwatermarked sampler to those
it saw green or scoring above the null's mean. The detector accepts both; the spoof check tells them apart.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from http_fixtures import call, make_token, serve, shared_vocabulary, single_token_words
from scipy import stats

from api.detector.app import create_app, services_of
from api.generation.own_output import OwnOutput
from db.output_memory import WARMUP, MemoryMirror, OutputMemory
from db.store import Store
from detector import common_units
from detector.normalize import normalize
from detector.scoring_sampling import positions, sampling_identities
from detector.service import Detector
from detector.spoof_check import MIN_NULL, SPOOF_ALPHA, SpoofNull, StoredCounts, spoof_check
from generation.sequence import WatermarkInfo
from watermark.keys import Keyring
from watermark.sampling_common import SeenContexts
from watermark.scheme import make_watermark
from watermark.specs import is_sampling
from watermark.vocab import encode

pytest_plugins = ["pg"]

SPEC = "kgw:scheme=lefthash,h=1,gamma=0.25,delta=2.0"
KEY = "spoofed"
WORDS = 3000  # single-token words, Zipf frequencies
LENGTH = 120  # words per text
OUTPUTS = 240  # the service's own outputs (the memory and the null)
STEER = 4.0  # the thief's bias on the next words it believes green / high-scoring
FALSE_FLAG_LEVEL = 1e-3  # chance that a genuine-output bound fails when the check flags at its stated SPOOF_ALPHA


@pytest.fixture(scope="module")
def world():
    vocab = shared_vocabulary()
    words = single_token_words(vocab, WORDS)  # ascending ids: the candidates of a keyed sampler, in order
    base = -1.1 * torch.log(torch.arange(1, len(words) + 1, dtype=torch.float32))  # logits over the words
    return vocab, torch.tensor(words), base


def sample(world, mark, generator, steer=None) -> list[int]:
    """LENGTH words: Zipf logits plus noise, the key's bias or keyed sampler (``mark``) or the thief's
    steering (``steer``)."""
    _, words, base = world
    ids = [int(words[int(torch.randint(0, 50, (1,), generator=generator))])]
    seen = SeenContexts()
    for _ in range(LENGTH - 1):
        logits = base + 0.5 * torch.randn(base.shape, generator=generator)
        if mark is not None and is_sampling(mark.spec):
            ids.append(keyed_choice(mark, words, logits, ids, seen, generator))
            continue
        if mark is not None:  # the engine's soft bias, on the words (every other logit is -inf)
            logits += mark.spec.delta * mark.green_mask(torch.tensor([[ids[-1]]]))[0, words]
        if steer is not None:
            logits[steer.get(ids[-1], [])] += STEER
        ids.append(int(words[int(torch.multinomial(torch.softmax(logits, 0), 1, generator=generator))]))
    return ids


def keyed_choice(mark, words: torch.Tensor, logits: torch.Tensor, ids: list[int], seen: SeenContexts,
                 generator) -> int:
    """The next word by a sampling watermark's own stage (gumbel: the race; synthid: a draw from the
    tournament's winner distribution) over the words; plain sampling on a context the text had before."""
    probs = torch.softmax(logits, 0)
    context = tuple(ids[-mark.context_width:])
    if not seen.first_time(context):
        return int(words[int(torch.multinomial(probs, 1, generator=generator))])
    contexts, candidates = torch.tensor([context]), words.unsqueeze(0)
    if mark.spec.kind == "gumbel":
        return int(mark.choose_among(probs.unsqueeze(0), contexts, candidates)[0])
    winners, at = mark.winner_distribution(probs.unsqueeze(0), contexts, candidates)
    # 1 + g - mass rounds to a hair below 0 where the mass is ~1 and g = 0: that winner has probability 0
    return int(at[0, int(torch.multinomial(winners[0].clamp_min(0.0), 1, generator=generator))])


def as_text(world, ids: list[int]) -> str:
    return world[0].tokenizer.decode(ids)


def believed(mark):
    """What the thief believes of a bigram (a, b) whose colour or score it read: KGW green; gumbel and
    synthid a score above its mean under H0 (s = -log(1 - r) > 1; more than half the layers g = 1)."""
    if not is_sampling(mark.spec):
        return lambda a, b: bool(mark.green_mask(torch.tensor([[a]]))[0, b])
    null_mean = 1.0 if mark.spec.kind == "gumbel" else 0.5 * mark.layers

    def high(a: int, b: int) -> bool:
        values = mark.scored_positions(torch.tensor([a, b]))[0].numpy()
        return float(values.sum()) > null_mean  # gumbel: s; synthid: the g = 1 layers of the unit
    return high


def thief_table(mark, words: torch.Tensor, outputs: list[list[int]]) -> dict[int, list[int]]:
    """context word -> the next words the thief believes green (or high-scoring): bigrams it read twice or
    more (their colours or scores as the key has them: a perfect estimate of what it saw)."""
    seen: dict[tuple[int, int], int] = {}
    for ids in outputs:
        for pair in set(zip(ids, ids[1:])):
            seen[pair] = seen.get(pair, 0) + 1
    position = {int(w): i for i, w in enumerate(words.tolist())}
    good = believed(mark)
    table: dict[int, list[int]] = {}
    for (a, b), n in seen.items():
        if n >= 2 and good(a, b):
            table.setdefault(a, []).append(position[b])  # indices into the word logits
    return table


@dataclass
class SpoofRun:
    """Verdicts (explain scope) of the thief's texts and of held-out genuine output, and the views checked."""

    spoofed: list[dict]
    real: list[dict]
    judged: int | None  # index of the first flagged spoof (else of the first accepted one)
    shown: dict | None  # that spoof as the detect scope sees it
    plain: dict  # an unwatermarked text
    stored: dict | None  # the stored options of that spoof's verdict

    @property
    def accepted(self) -> list[dict]:
        return [v for v in self.spoofed if v["verdict"] == "watermarked"]

    @property
    def flagged(self) -> list[dict]:
        return [v for v in self.accepted if v["spoof_suspected"]]


def spoof_run(tmp_path, world, spec: str, label: bytes, spoofs: int, genuine: int, seed: int) -> SpoofRun:
    """A key bound to ``spec`` writes OUTPUTS texts through the generation side's hook; the thief's
    ``spoofs`` texts, ``genuine`` held-out outputs (not in the memory) and one plain text go to the detector
    service over HTTP."""
    vocab = world[0]
    keyring = Keyring(tmp_path / "home")
    keyring.create(KEY, secret=hashlib.sha256(label).digest(), spec=spec)
    mark = make_watermark(spec, keyring.secret(KEY), vocab.vocab_size, KEY)
    store = Store(url=f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    own = OwnOutput(store, keyring)
    info = WatermarkInfo(mark.spec.format(), KEY, mark.fingerprint)  # what a finished output carries
    generator = torch.Generator().manual_seed(seed)
    outputs = [sample(world, mark, generator) for _ in range(OUTPUTS)]
    for ids in outputs:  # what the generation service does as it issues each receipt
        own.remember(info, ids, vocab)
    assert OutputMemory(store).null_of(KEY).size >= MIN_NULL  # the generation side remembered the key's output
    steer = thief_table(mark, world[1], outputs)
    spoof_ids = [sample(world, None, generator, steer) for _ in range(spoofs)]
    genuine_ids = [sample(world, mark, generator) for _ in range(genuine)]  # held out: not in the memory
    plain_ids = sample(world, None, generator)

    app = create_app({"home": tmp_path / "home", "vocab": vocab, "store": store, "keyring": keyring})
    token, detect_only = make_token(store, "detect", "explain"), make_token(store, "detect")
    with serve(app) as base_url:
        def verdict(ids, who=token):
            status, body, _ = call("POST", base_url + "/v1/detect", {"text": as_text(world, ids), "keys": [KEY]},
                                   token=who)
            assert status == 200, body
            return body

        spoofed = [verdict(ids) for ids in spoof_ids]
        real = [verdict(ids) for ids in genuine_ids]
        accepted = [i for i, v in enumerate(spoofed) if v["verdict"] == "watermarked"]
        first = next((i for i in accepted if spoofed[i]["spoof_suspected"]), accepted[0] if accepted else None)
        shown = None if first is None else verdict(spoof_ids[first], detect_only)
        plain = verdict(plain_ids)
    stored = None
    if first is not None:
        from db.rows import VerdictRow

        with services_of(app).store.read() as session:
            stored = session.get(VerdictRow, spoofed[first]["id"]).options
    return SpoofRun(spoofed, real, first, shown, plain, stored)


def keyed_memory(tmp_path, vocab, spec: str, label: bytes, master_key: bytes | None = None) -> tuple:
    """(A keyring with KEY bound to ``spec``, its secret from ``label``; KEY's watermark; a SQLite store; the
    generation side's hook writing into it; the memory reading it; what a finished output under KEY carries)."""
    keyring = Keyring(tmp_path / "home", master_key=master_key)
    keyring.create(KEY, secret=hashlib.sha256(label).digest(), spec=spec)
    mark = make_watermark(spec, keyring.secret(KEY), vocab.vocab_size, KEY)
    store = Store(url=f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    info = WatermarkInfo(mark.spec.format(), KEY, mark.fingerprint)
    return keyring, mark, store, OwnOutput(store, keyring), OutputMemory(store), info


def allowed_false_flags(texts: int) -> int:
    """The most genuine texts flagged that still fit a check flagging each at SPOOF_ALPHA (binomial tail at
    FALSE_FLAG_LEVEL)."""
    return int(stats.binom.isf(FALSE_FLAG_LEVEL, texts, SPOOF_ALPHA))


def assert_views(run: SpoofRun) -> None:
    """Genuine output is flagged no more than the binomial allows and judged against the whole null; the
    detect scope sees the one bit, not the statistic; a negative carries none; the audit trail keeps it."""
    assert all(v["verdict"] == "watermarked" for v in run.real), [v["z_score"] for v in run.real]
    flagged_real = sum(bool(v["spoof_suspected"]) for v in run.real)
    assert flagged_real <= allowed_false_flags(len(run.real)), [v["spoof_check"] for v in run.real]
    assert all(v["spoof_check"]["null_outputs"] == OUTPUTS - WARMUP for v in run.real)
    assert all(v["spoof_check"]["null_outputs"] == OUTPUTS - WARMUP for v in run.accepted)
    assert all(v["spoof_check"]["p_value"] <= SPOOF_ALPHA for v in run.flagged)
    judged = run.spoofed[run.judged]
    # the detect view re-derives the verdict from a dithered z: the bit, or None where it shows no positive
    assert "spoof_check" not in run.shown and run.shown["spoof_suspected"] in (judged["spoof_suspected"], None)
    plain = run.plain
    assert plain["verdict"] != "watermarked" and plain["spoof_suspected"] is None and plain["spoof_check"] is None
    assert run.stored["spoof_check"] == judged["spoof_check"]  # the audit trail keeps it


def test_the_memory_counts_units_per_key_and_keeps_the_null_past_the_warm_up(database_url):
    store = Store(url=database_url)
    store.upgrade()
    memory = OutputMemory(store)
    big = np.array([2**64 - 1, 2**63, 5, 5], dtype=np.uint64)  # the high bit survives the int64 column
    memory.record("k1", big, 0.5)
    memory.record("k1", np.array([5, 7], dtype=np.uint64), None)
    memory.record("k2", np.array([5], dtype=np.uint64), float("nan"))
    assert memory.counts_of("k1", np.array([2**64 - 1, 2**63, 5, 7, 9], dtype=np.uint64)).tolist() == [1, 1, 2, 1, 0]
    assert memory.counts_of("k2", np.array([5, 7], dtype=np.uint64)).tolist() == [1, 0]
    assert (memory.outputs("k1"), memory.outputs("k2"), memory.outputs("k3")) == (2, 1, 0)
    for i in range(2, WARMUP + 3):  # outputs 2 .. WARMUP + 2; z = their index
        memory.record("k1", np.array([i], dtype=np.uint64), float(i))
    # the null: outputs with a z that had WARMUP or more outputs before them, most recent first
    assert memory.null_of("k1").tolist() == [float(WARMUP + 2), float(WARMUP + 1), float(WARMUP)]
    assert memory.null_of("k1", limit=2).tolist() == [float(WARMUP + 2), float(WARMUP + 1)]
    assert memory.null_of("k2").size == 0
    store.close()


def test_the_generation_side_names_sampling_units_as_the_detector_counts_them(tmp_path, world):
    """gumbel: and synthid: outputs are remembered under the identities the sampling detector scores by;
    vllm:gumbel (no common-unit table, its own reference detector) is not remembered."""
    vocab = world[0]
    keyring = Keyring(tmp_path / "home")
    store = Store(url=f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    own, memory = OwnOutput(store, keyring), OutputMemory(store)
    generator = torch.Generator().manual_seed(3)
    for i, spec in enumerate(("gumbel:h=1", "synthid:h=1", "vllm:gumbel,context_width=1")):
        key = f"k{i}"
        keyring.create(key, secret=hashlib.sha256(spec.encode()).digest(), spec=spec)
        mark = make_watermark(spec, keyring.secret(key), vocab.vocab_size, key)
        ids = sample(world, None, generator)
        own.remember(WatermarkInfo(mark.spec.format(), key, mark.fingerprint), ids, vocab)
        if mark.spec.kind == "vllm:gumbel":
            assert memory.outputs(key) == 0
            continue
        _, prev, units = positions(mark, torch.tensor(ids), True, common_units.for_spec(mark.spec, vocab),
                                   with_units=True)[:3]
        named = sampling_identities(units)
        assert memory.outputs(key) == 1 and (memory.counts_of(key, named) == 1).all()


def test_spoofs_the_detector_accepts_are_flagged_and_genuine_output_is_not(tmp_path, world):
    run = spoof_run(tmp_path, world, SPEC, b"provmark-test/spoof-on-verdicts", spoofs=16, genuine=12, seed=7)
    accepted = run.accepted
    assert len(accepted) >= 16 // 2, [v["z_score"] for v in run.spoofed]  # the thief fools the detector
    # measured on this world: 20 of 30 spoofs at SPOOF_ALPHA (a weak check would flag ~SPOOF_ALPHA of them)
    assert len(run.flagged) >= len(accepted) // 2, [v["spoof_check"] for v in accepted]
    assert allowed_false_flags(12) == 1  # each genuine text is flagged with probability ~SPOOF_ALPHA
    assert_views(run)
    assert run.stored["spoof_check"]["suspected"] is True


# Spoofs the check flags at SPOOF_ALPHA, of those the detector accepted, measured in this world (30 spoofs,
# seeds 11, 12, 13; docs/security.md): synthid 9, 9 and 14 of 30. Gumbel 0 of 30 and 0 of 28 (seeds 11, 12):
# its genuine output here puts its high scores on the units that recur (null median z 3.4, the spoofs' 3.1),
# so no power is claimed for it; its test checks the wiring and that genuine output is not flagged.
SAMPLING_FLAG_RATES = {"synthid:h=1": 32 / 90, "gumbel:h=1": None}
POWER_LEVEL = 0.01  # the flagged count asserted: what a check with the measured rate reaches 99 % of the time


@pytest.mark.parametrize("spec", list(SAMPLING_FLAG_RATES), ids=["synthid", "gumbel"])
def test_spoofs_of_a_sampling_watermark_are_flagged_and_its_genuine_output_is_not(tmp_path, world, spec):
    run = spoof_run(tmp_path, world, spec, b"provmark-test/spoof-on-verdicts/" + spec.encode(), spoofs=30,
                    genuine=24, seed=11)
    accepted = run.accepted
    assert len(accepted) >= 30 // 2, [v["z_score"] for v in run.spoofed]  # the thief fools the detector
    rate = SAMPLING_FLAG_RATES[spec]
    assert all(v["spoof_check"] is not None and isinstance(v["spoof_check"]["z"], float) for v in accepted)
    if rate is None:  # no measured power: the z is reported, the bit is not given (not a false assurance)
        assert all(v["spoof_check"]["suspected"] is None and v["spoof_suspected"] is None
                   for v in accepted + run.real)
    else:
        assert all(v["spoof_check"]["suspected"] is not None for v in accepted)
    assert allowed_false_flags(24) == 1
    assert_views(run)
    if rate is not None:
        required = int(stats.binom.ppf(POWER_LEVEL, len(accepted), rate))
        assert required > allowed_false_flags(len(accepted))  # more than a check without power flags
        assert len(run.flagged) >= required, [v["spoof_check"] for v in accepted]


@pytest.mark.parametrize("spec", [SPEC, "gumbel:h=1", "synthid:h=1"], ids=["kgw", "gumbel", "synthid"])
def test_a_verdicts_spoof_check_is_its_definition(tmp_path, world, spec):
    """What a positive verdict reports (its first scoring pass's units, counts and null from the detector's
    in-process copy of the memory, ``MemoryMirror``) equals the check's definition: the text scored again
    (``spoof_check``), counts read from the store, the null as stored, scipy's normal tail; also as the
    memory grows between verdicts."""
    vocab = world[0]
    keyring, mark, store, own, memory, info = keyed_memory(tmp_path, vocab, spec,
                                                           b"provmark-test/spoof-definition/" + spec.encode())
    generator = torch.Generator().manual_seed(3)
    for _ in range(WARMUP + MIN_NULL + 5):
        own.remember(info, sample(world, mark, generator), vocab)
    detector = Detector(vocab=vocab, keyring=keyring, output_memory=MemoryMirror(memory, sync_seconds=0.0))
    common = common_units.for_spec(mark.spec, vocab)
    checked = 0
    for _ in range(6):
        text = as_text(world, sample(world, mark, generator))
        verdict = detector.detect(text, keys=[KEY])
        assert verdict.watermarked
        ids = torch.tensor(encode(vocab, normalize(text).text))
        check = spoof_check(mark, ids, common, StoredCounts(memory, KEY))
        null = np.asarray(memory.null_of(KEY))
        expected = stats.norm.sf(check.z, loc=null.mean(), scale=null.std(ddof=1))
        found = verdict.spoof_check
        assert found["z"] == round(check.z, 4) and found["units"] == check.units
        assert found["null_outputs"] == null.size
        assert found["p_value"] == pytest.approx(expected, rel=1e-9, abs=1e-300)
        assert found["p_value_empirical"] == SpoofNull(null).p_value(check.z)
        checked += 1
        own.remember(info, sample(world, mark, generator), vocab)  # the next verdict sees one more output
    assert checked == 6


def test_the_match_run_by_the_scoring_call_gives_the_verdict_of_its_own_call(tmp_path, world, monkeypatch):
    """Every verdict of a KGW key with remembered output gets its own-output match from the scoring kernel's call
    (``db.output_grams.MatchRequest``); with no request made, the index's own call gives the same verdicts, own
    output and spoof check included: fresh output, remembered output (checked without itself), human-like text."""
    from db.count_table import native_library
    from db.output_grams import GramIndex, MatchRequest
    from detector import scoring_kernel

    if native_library() is None or not scoring_kernel.available():
        pytest.skip("no C compiler: the index answers on its own")
    vocab = world[0]
    keyring, mark, store, own, memory, info = keyed_memory(tmp_path, vocab, SPEC, b"provmark-test/kernel-match")
    generator = torch.Generator().manual_seed(5)
    remembered = []
    for _ in range(WARMUP + MIN_NULL + 5):
        remembered.append(sample(world, mark, generator))
        own.remember(info, remembered[-1], vocab)
    detector = Detector(vocab=vocab, keyring=keyring, output_memory=MemoryMirror(memory))
    texts = [as_text(world, ids) for ids in
             [sample(world, mark, generator) for _ in range(4)] + remembered[-3:] + [sample(world, None, generator)]]
    answers = []
    result = MatchRequest.result

    def counted(self):
        found = result(self)
        answers.append(found is not None)
        return found

    monkeypatch.setattr(MatchRequest, "result", counted)
    in_kernel = [detector.detect(t, keys=[KEY]).to_dict() for t in texts]
    monkeypatch.setattr(GramIndex, "match_request", lambda self, key: None)
    on_its_own = [detector.detect(t, keys=[KEY]).to_dict() for t in texts]
    assert in_kernel == on_its_own
    assert answers == [True] * len(texts)  # every verdict, positive or not, took the kernel's answer
    positives = [v for v in in_kernel if v["verdict"] == "watermarked"]
    assert len(positives) >= 6 and all(v["spoof_check"] is not None for v in positives)
    assert sum(v["own_output"]["matched"] for v in positives) == 3  # the remembered ones, checked without themselves
    assert any(v["verdict"] != "watermarked" and v["own_output"] is not None for v in in_kernel)
