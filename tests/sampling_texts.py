"""Texts watermarked by the sampling watermarks' own stages (no engine, no model): each token is chosen by
the scheme's ``choose`` / tournament / transformers' processor from a toy distribution over whole words,
so the decoded text re-tokenizes to exactly the ids that were chosen (each word is one token)."""

from __future__ import annotations

import torch
from http_fixtures import FILLER_WORDS

from watermark.sampling_common import SeenContexts
from watermark.vocab import encode

PREFIX = "Words of the day:"  # a few ordinary tokens first: the first scored contexts are words too


def word_ids(vocab) -> list[int]:
    """Single-token whole words (with their leading space)."""
    return [ids[0] for ids in (encode(vocab, w) for w in FILLER_WORDS) if len(ids) == 1]


def toy_logits(vocab, words: list[int], generator: torch.Generator) -> torch.Tensor:
    """[1, V]: -inf except the words, whose logits are N(0, 1.5^2) (a fresh distribution every step)."""
    logits = torch.full((1, vocab.vocab_size), float("-inf"))
    logits[0, words] = torch.randn(len(words), generator=generator) * 1.5
    return logits


def sampled_ids(vocab, mark, length: int, seed: int) -> list[int]:
    """``PREFIX`` then ``length`` words, each chosen by ``mark``'s own sampler on a fresh context (plain
    sampling on a repeated one, as generation-time dedup does)."""
    generator = torch.Generator().manual_seed(seed)
    words = word_ids(vocab)
    ids = encode(vocab, PREFIX)
    seen = SeenContexts()
    kind = mark.spec.kind
    h = mark.context_width
    for _ in range(length):
        logits = toy_logits(vocab, words, generator)
        context = tuple(ids[-h:])
        if not seen.first_time(context):
            token = int(torch.multinomial(torch.softmax(logits[0], 0), 1, generator=generator))
        elif kind == "gumbel":
            token = int(mark.choose(logits, torch.tensor([context]))[0])
        elif kind == "vllm:gumbel":  # vLLM's race: argmax(logits + Gumbel noise); only the words can win
            u = mark.uniforms(torch.tensor([context]), torch.tensor(words))[0]
            u = u.clamp_min(torch.finfo(torch.float32).tiny)
            token = words[int(torch.argmax(logits[0, words] - torch.log(-torch.log(u))))]
        elif kind == "synthid":
            tournament = mark.tournament_logits(logits, torch.tensor([context]))
            token = int(torch.multinomial(torch.softmax(tournament[0], 0), 1, generator=generator))
        else:
            raise ValueError(kind)
        ids.append(token)
    return ids


def transformers_synthid_ids(vocab, keys: list[int], ngram_len: int, length: int, seed: int) -> list[int]:
    """``PREFIX`` then ``length`` words sampled through transformers' own SynthIDTextWatermarkLogitsProcessor."""
    from transformers.generation.logits_process import SynthIDTextWatermarkLogitsProcessor

    processor = SynthIDTextWatermarkLogitsProcessor(ngram_len=ngram_len, keys=keys, sampling_table_size=2**16,
                                                    sampling_table_seed=0, context_history_size=1024,
                                                    device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    words = word_ids(vocab)
    ids = encode(vocab, PREFIX)
    for _ in range(length):
        logits = toy_logits(vocab, words, generator)
        scores = processor(torch.tensor([ids]), logits.clone())
        ids.append(int(torch.multinomial(torch.softmax(scores[0], 0), 1, generator=generator)))
    return ids


def as_text(vocab, ids: list[int]) -> str:
    """The decoded text; asserts it re-tokenizes to ``ids`` (else the test would score other tokens)."""
    text = vocab.tokenizer.decode(ids)
    assert encode(vocab, text) == ids, "the toy text does not re-tokenize to its ids"
    return text
