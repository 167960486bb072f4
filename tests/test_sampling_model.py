"""The sampling watermarks on the embedded model (SmolLM2-135M-Instruct), end to end through text:
transformers' own SynthID processor, and our Gumbel and SynthID stages in a plain sampling loop
(the engine wiring is a later step), detected from the decoded and re-tokenized text."""

import hashlib

import pytest
import torch
from transformers import SynthIDTextWatermarkingConfig

from detector.scoring_sampling import score_text
from watermark.gumbel import GumbelWatermark
from watermark.hf_synthid import HFSynthID
from watermark.sampling_common import SeenContexts
from watermark.synthid import SynthIDWatermark

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
TOKENS = 200
ALPHA = 1e-5
HF_KEYS = [654, 400, 836, 123, 340, 443, 597, 160, 57, 29, 590, 639, 13, 715, 468, 990, 966, 226, 324, 585,
           118, 504, 421, 521, 129, 669, 732, 225, 90, 960]  # 30 layers, as transformers' docs
SECRET = hashlib.sha256(b"provmark-test/sampling-model").digest()
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _prompt_ids(loaded):
    tokenizer = loaded.vocab.tokenizer
    text = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids


def _retokenized(loaded, new_ids) -> torch.Tensor:
    text = loaded.vocab.tokenizer.decode(new_ids, skip_special_tokens=True)
    return torch.tensor(loaded.vocab.tokenizer(text, add_special_tokens=False).input_ids)


def test_text_watermarked_by_transformers_synthid_is_detected(loaded):
    torch.manual_seed(0)
    prompt = _prompt_ids(loaded)
    config = SynthIDTextWatermarkingConfig(keys=HF_KEYS, ngram_len=5)
    out = loaded.model.generate(prompt, watermarking_config=config, do_sample=True, temperature=1.0, top_k=0,
                                top_p=1.0, max_new_tokens=TOKENS, min_new_tokens=TOKENS)
    ids = _retokenized(loaded, out[0, prompt.shape[1]:])
    mark = HFSynthID(f"hf:synthid,keys={':'.join(map(str, HF_KEYS))},ngram_len=5", loaded.vocab.vocab_size)
    score = score_text(mark, ids)
    assert score.p_value < ALPHA, score
    other = HFSynthID(f"hf:synthid,keys={':'.join(str(k + 1) for k in HF_KEYS)},ngram_len=5", loaded.vocab.vocab_size)
    assert score_text(other, ids).p_value > 1e-3


def _sample_loop(loaded, stage, seed: int) -> list[int]:
    """Temperature-1 sampling with a KV cache; ``stage(logits [1, V], context) -> token`` on fresh contexts."""
    generator = torch.Generator().manual_seed(seed)
    ids = _prompt_ids(loaded)
    history = ids[0].tolist()
    seen, new, past = SeenContexts(), [], None
    eos = loaded.vocab.eos_token_id
    with torch.no_grad():
        step_input = ids
        for _ in range(TOKENS):
            out = loaded.model(step_input, past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1, :].float()
            if eos is not None:
                logits[0, eos] = float("-inf")  # force TOKENS new tokens
            context = tuple(history[-4:])
            if seen.first_time(context):
                token = stage(logits, torch.tensor([context]), generator)
            else:
                token = int(torch.multinomial(torch.softmax(logits[0], 0), 1, generator=generator))
            history.append(token)
            new.append(token)
            step_input = torch.tensor([[token]])
    return new


@pytest.mark.parametrize("kind", ["gumbel", "synthid"])
def test_our_sampling_watermarks_are_detected_at_200_tokens(loaded, kind):
    V = loaded.vocab.vocab_size
    if kind == "gumbel":
        mark = GumbelWatermark("gumbel:h=4", SECRET, V)

        def stage(logits, context, generator):
            return int(mark.choose(logits, context)[0])
    else:
        mark = SynthIDWatermark("synthid:h=4,layers=30", SECRET, V)

        def stage(logits, context, generator):
            return int(torch.multinomial(torch.softmax(mark.tournament_logits(logits, context)[0], 0), 1,
                                         generator=generator))
    ids = _retokenized(loaded, _sample_loop(loaded, stage, seed=1))
    score = score_text(mark, ids)
    assert score.p_value < ALPHA, score
