"""The spoof check on verdicts (issue #17), end to end without a model: the generation service's memory of
its own output (``db.output_memory``, on SQLite and PostgreSQL), filled by the generation side's hook
(``api.generation.own_output``), read by the detector service for every positive KGW verdict.

A toy world over single-token words with Zipf frequencies stands in for the model: the service's outputs
are sampled with the key's bias (``Watermark.bias``); a thief who read them knows the colours of the
bigrams it saw at least twice (an upper bound on what stealing estimates, docs/security.md) and steers an
unwatermarked sampler to those it saw green. The detector accepts both; the spoof check tells them apart.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from http_fixtures import call, make_token, serve, shared_vocabulary, single_token_words

from api.detector.app import create_app, services_of
from api.generation.own_output import OwnOutput
from db.output_memory import WARMUP, OutputMemory
from db.store import Store
from generation.sequence import WatermarkInfo
from detector.spoof_check import MIN_NULL, SPOOF_ALPHA
from watermark.keys import Keyring
from watermark.scheme import make_watermark

pytest_plugins = ["pg"]

SPEC = "kgw:scheme=lefthash,h=1,gamma=0.25,delta=2.0"
KEY = "spoofed"
WORDS = 3000  # single-token words, Zipf frequencies
LENGTH = 120  # words per text
OUTPUTS = 240  # the service's own outputs (the memory and the null)


@pytest.fixture(scope="module")
def world():
    vocab = shared_vocabulary()
    words = single_token_words(vocab, WORDS)
    base = -1.1 * torch.log(torch.arange(1, len(words) + 1, dtype=torch.float32))  # logits over the words
    return vocab, torch.tensor(words), base


def sample(world, mark, generator, steer=None) -> list[int]:
    """LENGTH words: Zipf logits plus noise, the key's bias (``mark``) or the thief's steering (``steer``)."""
    _, words, base = world
    ids = [int(words[int(torch.randint(0, 50, (1,), generator=generator))])]
    for _ in range(LENGTH - 1):
        logits = base + 0.5 * torch.randn(base.shape, generator=generator)
        if mark is not None:  # the engine's soft bias, on the words (every other logit is -inf)
            logits += mark.spec.delta * mark.green_mask(torch.tensor([[ids[-1]]]))[0, words]
        if steer is not None:
            logits[steer.get(ids[-1], [])] += 4.0
        ids.append(int(words[int(torch.multinomial(torch.softmax(logits, 0), 1, generator=generator))]))
    return ids


def as_text(world, ids: list[int]) -> str:
    return world[0].tokenizer.decode(ids)


def thief_table(mark, words: torch.Tensor, outputs: list[list[int]]) -> dict[int, list[int]]:
    """context word -> the next words the thief believes green: bigrams it read twice or more (their
    colours as the key has them: a perfect estimate of what it saw)."""
    seen: dict[tuple[int, int], int] = {}
    for ids in outputs:
        for pair in set(zip(ids, ids[1:])):
            seen[pair] = seen.get(pair, 0) + 1
    position = {int(w): i for i, w in enumerate(words.tolist())}
    table: dict[int, list[int]] = {}
    for (a, b), n in seen.items():
        if n >= 2 and bool(mark.green_mask(torch.tensor([[a]]))[0, b]):
            table.setdefault(a, []).append(position[b])  # indices into the word logits
    return table


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


def test_spoofs_the_detector_accepts_are_flagged_and_genuine_output_is_not(tmp_path, world):
    vocab = world[0]
    keyring = Keyring(tmp_path / "home")
    keyring.create(KEY, secret=hashlib.sha256(b"provmark-test/spoof-on-verdicts").digest(), spec=SPEC)
    mark = make_watermark(SPEC, keyring.secret(KEY), vocab.vocab_size, KEY)
    store = Store(url=f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    own = OwnOutput(store, keyring)
    info = WatermarkInfo(mark.spec.format(), KEY, mark.fingerprint)  # what a finished output carries
    generator = torch.Generator().manual_seed(7)
    outputs = [sample(world, mark, generator) for _ in range(OUTPUTS)]
    for ids in outputs:  # what the generation service does as it issues each receipt
        own.remember(info, ids, vocab)
    assert OutputMemory(store).null_of(KEY).size >= MIN_NULL
    steer = thief_table(mark, world[1], outputs)
    spoofs = [sample(world, None, generator, steer) for _ in range(16)]
    genuine = [sample(world, mark, generator) for _ in range(12)]  # held out: not in the memory

    app = create_app({"home": tmp_path / "home", "vocab": vocab, "store": store, "keyring": keyring})
    token, detect_only = make_token(store, "detect", "explain"), make_token(store, "detect")
    with serve(app) as base_url:
        def verdict(ids, who=token):
            status, body, _ = call("POST", base_url + "/v1/detect", {"text": as_text(world, ids), "keys": [KEY]},
                                   token=who)
            assert status == 200, body
            return body

        spoofed = [verdict(ids) for ids in spoofs]
        accepted = [v for v in spoofed if v["verdict"] == "watermarked"]
        assert len(accepted) >= len(spoofs) // 2, [v["z_score"] for v in spoofed]  # the thief fools the detector
        flagged = [v for v in accepted if v["spoof_suspected"]]
        assert all(v["spoof_check"]["p_value"] <= SPOOF_ALPHA for v in flagged)
        # measured on this world: 20 of 30 spoofs at SPOOF_ALPHA (a weak check would flag ~SPOOF_ALPHA of them)
        assert len(flagged) >= len(accepted) // 2, [v["spoof_check"] for v in accepted]
        real = [verdict(ids) for ids in genuine]
        assert all(v["verdict"] == "watermarked" for v in real)
        # each genuine text is flagged with probability ~SPOOF_ALPHA under the null's normal fit
        assert sum(bool(v["spoof_suspected"]) for v in real) <= 1, [v["spoof_check"] for v in real]
        assert all(v["spoof_check"]["null_outputs"] == OUTPUTS - WARMUP for v in real)
        # the detect scope sees the one bit, not the statistic; a human-looking negative carries none
        shown = verdict(spoofs[spoofed.index(flagged[0])], detect_only)
        assert "spoof_check" not in shown and shown["spoof_suspected"] in (True, None)
        plain = verdict(sample(world, None, generator))
        assert plain["verdict"] != "watermarked" and plain["spoof_suspected"] is None and plain["spoof_check"] is None
        stored = services_of(app).store
    from db.rows import VerdictRow

    with stored.read() as session:
        row = session.get(VerdictRow, flagged[0]["id"])
    assert row.options["spoof_check"]["suspected"] is True  # the audit trail keeps it
