"""The detection fast paths of every sampling spec against their straightforward definitions, on random
token ids: the same values to the bit (so the same counts, sums and exact p-values)."""

import hashlib
import hmac
import struct

import numpy as np
import pytest
import torch

from detector.scoring_sampling import score_text
from watermark import prf as prf_module
from watermark import prf_kernel
from watermark.keyed_words import ContextSeeds, fmix64_reference
from watermark.prf import MASK64, KeyedPRF, mix64_reference, to_signed64
from watermark.sampling_scheme import sampling_watermark
from watermark.synthid import layer_bits, word_bits
from watermark.vllm_gumbel import philox4x32_10, philox_words

V = 49152
SECRET = bytes(range(7, 39))
HF_SPEC = "hf:synthid,keys=654:400:836:123:340:443:597:160,ngram_len=5"


def random_ids(seed: int, count: int, high: int = V) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, high, count))


def reference_words(secret: bytes, prf: str, scheme: str, units: torch.Tensor) -> list[int]:
    """fmix64(mix64(PRF(context), token)) per unit, one Python PRF call and integer mix each."""
    keyed = KeyedPRF(secret, prf, scheme)
    return [fmix64_reference(mix64_reference(keyed.seed(row[:-1]), row[-1]) & MASK64) for row in units.tolist()]


@pytest.fixture(params=["kernel", "hashlib"])
def prf_path(request, monkeypatch):
    """Run a test with the C batch kernel (skipped where it cannot be built) and with the hashlib loop."""
    if request.param == "kernel":
        if not prf_kernel.available():
            pytest.skip("the batched PRF kernel is not built here (no C compiler or OpenSSL headers)")
    else:
        monkeypatch.setattr(prf_module, "hmac_sha256_words", lambda *args: None)
    return request.param


@pytest.mark.parametrize("prf", ["hmac-sha256", "sha3-256"])
@pytest.mark.parametrize("key_length", [16, 32, 64, 65, 100])
def test_batched_prf_words_are_the_single_call_seeds(prf, key_length, prf_path):
    key = bytes(range(key_length))
    keyed = KeyedPRF(key, prf, "gumbel")
    for contexts in ([(), (0,), (5, 49151), (1, 2, 3, 4), (2**32 - 1,) * 7],  # mixed widths
                     [tuple(range(i, i + 4)) for i in range(0, 400, 4)]):  # one width: the kernel's batch
        packed = keyed.seed_words([struct.pack(f"<{len(c)}I", *c) for c in contexts])
        assert np.frombuffer(packed, dtype="<i8").tolist() == [keyed.seed(c) for c in contexts]
    if prf == "hmac-sha256":  # the single call is the standard library's HMAC
        message = b"provmark/kgw/v1\x00gumbel\x00" + struct.pack("<4I", 1, 2, 3, 4)
        digest = hmac.new(key, message, hashlib.sha256).digest()
        assert keyed.seed((1, 2, 3, 4)) == int.from_bytes(digest[:8], "little", signed=True)


def test_context_seeds_cached_or_not_are_the_prf_seeds(prf_path):
    seeds = ContextSeeds(SECRET, "hmac-sha256", "synthid")
    contexts = random_ids(1, 4 * 300, high=50).reshape(-1, 4)  # small ids: repeated rows inside one call
    expected = [KeyedPRF(SECRET, "hmac-sha256", "synthid").seed(row) for row in contexts.tolist()]
    assert seeds.seeds(contexts)[:, 0].tolist() == expected
    assert seeds.seeds(contexts)[:, 0].tolist() == expected  # every row from the cache
    assert seeds.seeds(contexts[:0]).shape == (0, 1)
    with pytest.raises(struct.error):
        seeds.seeds(torch.tensor([[1, -1, 2, 3]]))


@pytest.mark.parametrize("prf", ["hmac-sha256", "sha3-256"])
@pytest.mark.parametrize("h", [0, 1, 2, 4, 7, 9])
def test_context_seeds_of_every_width_are_the_prf_seeds(prf, h, prf_path):
    """The kernel's rows (no cache) and the cached hashlib rows, against one PRF call per row."""
    seeds = ContextSeeds(SECRET, prf, "gumbel")
    contexts = random_ids(10 + h, 3 * 97 * max(h, 1), high=30)[:97 * h].reshape(97, h)  # repeats when h is small
    contexts[0] = 2**32 - 1  # the largest id a context may hold
    expected = [KeyedPRF(SECRET, prf, "gumbel").seed(row) for row in contexts.tolist()]
    for _ in range(2):  # new, then seen contexts
        assert seeds.seed_values(contexts.numpy()).tolist() == expected
    seeds.clear()
    assert seeds.seed_values(contexts.numpy()[::-1]).tolist() == expected[::-1]  # a strided view


@pytest.mark.parametrize("spec", ["gumbel:h=4", "gumbel:h=1,prf=sha3-256", "synthid:h=4", "synthid:h=2,layers=7"])
def test_keyed_spec_positions_equal_the_reference_words(spec, prf_path):
    mark = sampling_watermark(spec, SECRET, V)
    ids = random_ids(2, 700)
    values, units = mark.scored_positions(ids)
    words = reference_words(SECRET, mark.spec.prf, mark.SCHEME, units)
    if spec.startswith("gumbel"):
        top = torch.tensor([w >> 12 for w in words], dtype=torch.float64)
        expected = -torch.log((2.0**52 - top - 0.5) / 2.0**52)  # s = -log(1 - r), r = (k + 1/2) / 2**52
    else:
        expected = torch.tensor([[(w >> d) & 1 for d in range(mark.layers)] for w in words], dtype=torch.uint8)
    assert values.dtype == expected.dtype
    assert torch.equal(values, expected)
    assert score_text(mark, ids).p_value == score_text(mark, ids.clone()).p_value  # cached seeds, same score


def test_numpy_philox_equals_the_int64_tensor_philox():
    rng = np.random.default_rng(3)
    words = rng.integers(0, 2**32, (6, 500), dtype=np.uint64)
    fast = philox4x32_10(tuple(words[:4]), tuple(words[4:]))
    slow = philox4x32_10(tuple(torch.from_numpy(w.astype(np.int64)) for w in words[:4]),
                         tuple(torch.from_numpy(w.astype(np.int64)) for w in words[4:]))
    for a, b in zip(fast, slow):
        assert a.astype(np.int64).tolist() == b.tolist()


def test_vllm_words_for_one_token_equal_the_whole_vocabulary_row():
    contexts = torch.cat([torch.full((1, 4), -1), random_ids(4, 4 * 20).reshape(-1, 4)])
    tokens = random_ids(5, 21).reshape(-1, 1)
    key = to_signed64(0xDEADBEEF12345678) & MASK64
    full = philox_words(key, contexts, torch.arange(V))
    assert torch.equal(philox_words(key, contexts, tokens), full.gather(1, tokens))


def test_hf_synthid_positions_equal_the_per_layer_g_values():
    mark = sampling_watermark(HF_SPEC, None, V)
    ids = random_ids(6, 600)
    values, units = mark.scored_positions(ids)
    hashes = mark.context_hashes(ids.unfold(0, mark.spec.ngram_len, 1))
    expected = torch.stack([mark.layer_g(hashes, d) for d in range(mark.layers)], dim=-1).to(torch.uint8)
    assert torch.equal(values, expected)
    assert mark.null_g_rate == float(mark.table.sum()) / mark.table.shape[0]


@pytest.mark.parametrize("layers", [1, 7, 8, 30, 63, 64])
def test_word_bits_are_the_shifted_bits(layers):
    words = np.random.default_rng(layers).integers(0, 2**64, 500, dtype=np.uint64, endpoint=False)
    words[:3] = [0, 2**64 - 1, 2**63]
    expected = [[(w >> d) & 1 for d in range(layers)] for w in words.tolist()]
    bits = word_bits(words, layers)
    assert bits.dtype == np.uint8 and bits.tolist() == expected
    assert torch.equal(torch.from_numpy(bits), layer_bits(torch.from_numpy(words.view(np.int64)), layers))
