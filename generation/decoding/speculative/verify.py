"""The acceptance / rejection step of speculative sampling, as pure functions over distributions.

Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding", alg. 1) and Chen
et al. 2023: a token x drafted from q is kept with probability min(1, p(x) / q(x)); on rejection the
replacement is drawn from norm(max(0, p - q)). The kept-or-replaced token is then distributed exactly
as p, whatever q is. A deterministic proposal (prompt lookup) is q = one-hot(x): keep with
probability p(x), else draw from p with x removed. Greedy decoding keeps a draft while it equals the
target's argmax, which makes the output token-identical to plain greedy decoding. A sampling watermark
(Gumbel, SynthID) is verified by replay: the target's own choice at each position, left to right (a keyed
race needs no randomness; a draw takes one uniform, as the engine's), keeps a draft iff it equals it, so
the output is token-identical to the engine's for the same seed.
"""

from __future__ import annotations

import torch

from generation.sample.sampler import draw_


def draw_token(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from ``probs`` [V] (need not sum to 1) with one uniform from ``generator``.

    The engine's own draw (inverse CDF), so a step without drafts consumes randomness as it does."""
    return int(draw_(probs[None], [generator])[0])


def verify_token(p: torch.Tensor, q: torch.Tensor | None, draft_token: int,
                 generator: torch.Generator) -> tuple[bool, int]:
    """Accept or replace one drafted token; returns (accepted, token). The token is distributed as p.

    ``p`` and ``q`` are probability vectors [V] (target and drafter) at one position; ``q`` None means
    the draft was proposed deterministically (q = one-hot of ``draft_token``). ``draft_token`` must have
    q > 0, as any token drawn from q does."""
    x = int(draft_token)
    q_x = float(q[x]) if q is not None else 1.0
    if not q_x > 0.0:
        raise ValueError(f"draft token {x} has drafter probability {q_x}: it cannot have been drawn from q")
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    if u * q_x < float(p[x]):  # u < p/q, i.e. accept with probability min(1, p/q) since u < 1
        return True, x
    if q is None:
        residual = p.double().clone()
        residual[x] = 0.0  # max(0, p - one_hot(x))
    else:
        residual = (p.double() - q.double()).clamp_min_(0.0)
    if not float(residual.sum()) > 0.0:
        # p <= q everywhere means p == q: rejection has probability 0, reached only by float rounding
        residual = p.double()
    return False, draw_token(residual, generator)


def verify_round(p_rows: torch.Tensor, q_rows: torch.Tensor | None, drafts: list[int],
                 generator: torch.Generator) -> tuple[int, int]:
    """Verify ``k`` drafts left to right; returns (number accepted, the next token).

    ``p_rows`` [k + 1, V]: the target's distribution at each drafted position and one past the last;
    ``q_rows`` [k, V] the drafter's (None for a deterministic proposal). The next token is the
    replacement at the first rejection, or a bonus draw from ``p_rows[k]`` when all are accepted."""
    k = len(drafts)
    if p_rows.shape[0] != k + 1 or (q_rows is not None and q_rows.shape[0] != k):
        raise ValueError(f"verify_round: {k} drafts need {k + 1} target rows and {k} drafter rows")
    for j, x in enumerate(drafts):
        accepted, token = verify_token(p_rows[j], q_rows[j] if q_rows is not None else None, x, generator)
        if not accepted:
            return j, token
    return k, draw_token(p_rows[k], generator)


def verify_round_greedy(score_rows: torch.Tensor, drafts: list[int]) -> tuple[int, int]:
    """Greedy verification: keep drafts while each equals the target's argmax; (accepted, next token)."""
    best = score_rows.argmax(-1).tolist()
    for j, x in enumerate(drafts):
        if int(x) != best[j]:
            return j, best[j]
    return len(drafts), best[len(drafts)]


def verify_round_replay(choose, drafts: list[int]) -> tuple[int, int]:
    """Replay verification: ``choose(j)`` is the target's token at drafted position j (called left to right,
    and not past the first mismatch, so the request's generator advances exactly as without drafts);
    returns (accepted, next token)."""
    for j, x in enumerate(drafts):
        token = choose(j)
        if int(x) != token:
            return j, token
    return len(drafts), choose(len(drafts))
