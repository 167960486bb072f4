"""The attacks that ask a language model: substitutions it finds plausible, and paraphrase.

The attacker's model here is the evaluation's own (the embedded SmolLM2-135M-Instruct), without the
watermark: its choices are green with probability about gamma, like any unkeyed text.

* ``token-substitute-lm``: a chosen token is replaced by one drawn from the model's distribution
  at that position given the ORIGINAL tokens before it (one teacher-forced pass per text, so edits do
  not see each other), restricted to the top ``PLAUSIBLE_TOP_K`` and never the original token.
* ``word-lm``: a chosen word is replaced by a whole word the model proposes at the word's first
  token (same pass), with the original's capitalisation: "synonym-like" in the sense of a word that
  fits the left context; a 135M model often proposes a related word rather than a true synonym.
* ``paraphrase``: chosen sentences are rewritten one by one by the instruct model through the
  engine (chat template, temperature ``PARAPHRASE_TEMPERATURE``, seeded per sentence).
"""

from __future__ import annotations

import re

import torch

from evaluation.attack_context import WORD, AttackContext, choose, text_rng
from evaluation.corpus import sentence_spans
from generation.sample.sampler import SamplingParams

PLAUSIBLE_TOP_K = 50  # candidates kept from the model's distribution (top-k sampling's usual k)
WORD_PIECE = re.compile(r"^( ?)([A-Za-z]{2,})$")  # a token that is a whole word, maybe with its space
PARAPHRASE_INSTRUCTION = ("Rewrite the following sentence using different words but keeping its meaning. "
                          "Reply with the rewritten sentence only.\n\n{sentence}")
PARAPHRASE_TEMPERATURE = 0.7  # some variety, still on-topic for a small model
PARAPHRASE_MAX_TOKENS = 160
_PREAMBLE = re.compile(r"^(sure|here|certainly|rewritten|paraphrase|the rewritten)[^:\n]*:\s*", re.IGNORECASE)


def _need(context: AttackContext, what: str):
    found = getattr(context, what)
    if found is None:
        raise ValueError(f"this attack needs AttackContext.{what} (the evaluation model)")
    return found


def _sample_excluding(logits: torch.Tensor, banned: int, rng, allowed=None) -> int | None:
    """A token from softmax(logits) over the top-k, never ``banned``; ``allowed(id)`` filters more."""
    top = torch.topk(logits, min(PLAUSIBLE_TOP_K, logits.shape[-1]))
    ids = [int(i) for i in top.indices]
    weights = torch.softmax(top.values.double(), dim=-1).tolist()
    pairs = [(i, w) for i, w in zip(ids, weights) if i != banned and (allowed is None or allowed(i))]
    if not pairs:
        return None
    return rng.choices([i for i, _ in pairs], weights=[w for _, w in pairs])[0]


def token_substitute_lm(texts: list[str], rate: float, seed: int, context: AttackContext) -> list[str]:
    lm = _need(context, "lm")
    encoded = [context.encode(t) for t in texts]
    rngs = [text_rng(seed, "token-substitute-lm", rate, i) for i in range(len(texts))]
    positions = [[p + 1 for p in choose(rng, max(0, len(ids) - 1), rate)] for rng, ids in zip(rngs, encoded)]
    logits = lm.next_token_logits(encoded, positions)
    out = []
    for ids, rng, where, rows in zip(encoded, rngs, positions, logits):
        ids = list(ids)
        for p, row in zip(where, rows):
            new = _sample_excluding(row, ids[p], rng)
            if new is not None:
                ids[p] = new
        out.append(context.decode(ids))
    return out


def _match_case(word: str, model: str) -> str:
    if model.isupper() and len(model) > 1:
        return word.upper()
    if model[:1].isupper():
        return word[:1].upper() + word[1:]
    return word.lower()


def word_lm(texts: list[str], rate: float, seed: int, context: AttackContext) -> list[str]:
    lm = _need(context, "lm")
    tokenizer = context.tokenizer
    plans = []  # per text: (ids, [(word match, token index)], rng)
    for i, text in enumerate(texts):
        rng = text_rng(seed, "word-lm", rate, i)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
        words = list(WORD.finditer(text))
        picked = []
        for k in choose(rng, len(words), rate):
            start = words[k].start()
            token = next((j for j, (_, end) in enumerate(offsets) if end > start), None)
            if token is not None and token >= 1:  # the first token has no context to propose from
                picked.append((words[k], token))
        plans.append((ids, picked, rng))
    logits = lm.next_token_logits([p[0] for p in plans], [[t for _, t in p[1]] for p in plans])
    out = []
    for text, (ids, picked, rng), rows in zip(texts, plans, logits):
        pieces, last = [], 0
        for (match, token), row in zip(picked, rows):
            original = match.group(0)
            own_space = context.decode([ids[token]]).startswith(" ")

            def fits(candidate: int, own_space=own_space, original=original) -> bool:
                found = WORD_PIECE.match(context.decode([candidate]))
                return bool(found) and bool(found.group(1)) == own_space and found.group(2).lower() != original.lower()

            new = _sample_excluding(row, ids[token], rng, fits)
            if new is None:
                continue
            replacement = _match_case(context.decode([new]).strip(), original)
            pieces += [text[last: match.start()], replacement]
            last = match.end()
        out.append("".join(pieces) + text[last:])
    return out


def clean_paraphrase(reply: str) -> str:
    """The rewritten sentence from a chat reply: drop a "Here is..." preamble, quotes, extra lines."""
    reply = _PREAMBLE.sub("", reply.strip())
    lines = [line.strip() for line in reply.splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[0].strip().strip('"\u201c\u201d').strip()


def paraphrase(texts: list[str], rate: float, seed: int, context: AttackContext) -> list[str]:
    engine = _need(context, "engine")
    jobs = []  # (text index, span, prompt ids, params)
    for i, text in enumerate(texts):
        rng = text_rng(seed, "paraphrase", rate, i)
        spans = sentence_spans(text)
        for k in choose(rng, len(spans), rate):
            a, b = spans[k]
            prompt = engine.apply_chat_template(
                [{"role": "user", "content": PARAPHRASE_INSTRUCTION.format(sentence=text[a:b])}])
            budget = min(PARAPHRASE_MAX_TOKENS, 2 * len(context.encode(text[a:b])) + 16)
            params = SamplingParams(max_new_tokens=budget, temperature=PARAPHRASE_TEMPERATURE,
                                    seed=rng.getrandbits(63))
            jobs.append((i, (a, b), prompt, params))
    replies = engine.generate([j[2] for j in jobs], [j[3] for j in jobs], use_tqdm=False) if jobs else []
    rewritten: dict[int, list[tuple[tuple[int, int], str]]] = {}
    for (i, span, _, _), reply in zip(jobs, replies):
        rewritten.setdefault(i, []).append((span, clean_paraphrase(reply.text)))
    out = []
    for i, text in enumerate(texts):
        pieces, last = [], 0
        for (a, b), new in sorted(rewritten.get(i, [])):
            pieces += [text[last:a], new or text[a:b]]
            last = b
        out.append("".join(pieces) + text[last:])
    return out
