"""The sampler's stage functions as batched tensor transforms with per-row parameters and per-row state.

generation.sample.pipeline.LogitsPipeline runs them in order (its docstring names the stages):
penalties, logit bias and bans; temperature; truncation (or mirostat); the draw from each row's own
generator. A transform no row uses is skipped; rows with a transform off are left bit-for-bit untouched.

Rows with top-k skip the full vocabulary after one topk: temperature, the later truncations and the
draw run on the row's head of top_k (+ a few) tokens, where every other token is already -inf.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from generation.sample.params import SamplerState, SamplingParams
from generation.sample.top_head import top_head

__all__ = ["SamplingParams", "SamplerState"]

NEG_INF = float("-inf")
LN2 = math.log(2.0)
HEAD_BUCKETS_PER_NAT = 4  # top-p head bound: log-probability histogram with buckets of 1/4 nat
HEAD_BUCKETS = 256  # ... down to 64 nats below the top token; everything deeper shares the last bucket
HEAD_MARGIN = 16  # a few spare tokens against float rounding at the bucket edge
FULL_SORT_FRACTION = 4  # a head above V/4 tokens costs about a full sort (topk measured vs sort on CPU)
MIROSTAT_M = 100  # Basu et al. 2021, alg. 1: Zipf exponent estimated from the top m = 100 probabilities
HEAD_SPARE = 16  # head tokens past the largest top_k: room for ties at the k-th value (half-precision logits tie often)
TOP_K_HEAD = True  # False forces top-k rows through the full-vocabulary path (tests compare the two)


def rows_where(flags: list[bool], device) -> torch.Tensor | None:
    """Indices of the rows whose flag is set, or None when no row needs the transform."""
    idx = [i for i, f in enumerate(flags) if f]
    return torch.tensor(idx, dtype=torch.long, device=device) if idx else None


def on_rows_(scores: torch.Tensor, rows: torch.Tensor, fn: Callable[[torch.Tensor], None]) -> None:
    """Apply an in-place fn to scores[rows] only; whole-batch rows avoid the gather/scatter copy."""
    if rows.numel() == scores.shape[0]:
        fn(scores)
    else:
        sub = scores.index_select(0, rows)
        fn(sub)
        scores.index_copy_(0, rows, sub)


def column(values, rows: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor([values[i] for i in rows.tolist()], dtype=dtype, device=rows.device)[:, None]


def _entropy(logp: torch.Tensor) -> torch.Tensor:
    return -(logp * logp.exp()).nansum(-1, keepdim=True)  # -inf * 0 = nan counts as 0


# ---- stages 2-4 of generation.sample.pipeline: penalties, logit bias, bans (sparse: only the ids each row's history touches) ----

def _no_overflow_(scores: torch.Tensor) -> torch.Tensor:
    """Clamp logits pushed past the float range back to its largest value, in place.

    A tiny temperature or repetition penalty (both only need to be positive) divides logits into +inf,
    and one +inf in a row makes its log-softmax NaN. Clamped, the tokens that overflowed share the row's
    mass, which is the limit the request asks for; -inf (a banned token) stays -inf."""
    return scores.clamp_(max=torch.finfo(scores.dtype).max)


def apply_penalties_(scores: torch.Tensor, states: list[SamplerState]) -> None:
    """Repetition (CTRL, over prompt+generated), presence/frequency (OpenAI, generated), logit bias."""
    dev = scores.device
    rep_r, rep_i, rep_f, add_r, add_i, add_v = [], [], [], [], [], []
    for r, st in enumerate(states):
        p = st.params
        if p.repetition_penalty != 1.0:
            ids = st.seen_ids()
            rep_r.append(torch.full_like(ids, r)), rep_i.append(ids)
            rep_f.append(torch.full(ids.shape, p.repetition_penalty))
        if (p.presence_penalty or p.frequency_penalty) and st.counts:
            ids, counts = st.count_tensors()
            add_r.append(torch.full_like(ids, r)), add_i.append(ids)
            add_v.append(-(counts * p.frequency_penalty + p.presence_penalty))  # OpenAI: mu - c*a_f - 1[c>0]*a_p
        bias = st.logit_bias_tensors()
        if bias is not None:
            add_r.append(torch.full_like(bias[0], r)), add_i.append(bias[0]), add_v.append(bias[1])
    if rep_r:
        index = (torch.cat(rep_r).to(dev), torch.cat(rep_i).to(dev))
        factor = torch.cat(rep_f).to(dev)
        got = scores[index]
        scores[index] = _no_overflow_(torch.where(got < 0, got * factor, got / factor))
    if add_r:
        scores.index_put_((torch.cat(add_r).to(dev), torch.cat(add_i).to(dev)), torch.cat(add_v).to(dev), accumulate=True)


def apply_bans_(scores: torch.Tensor, states: list[SamplerState]) -> None:
    """-inf on no-repeat n-gram completions, bad words, and EOS/stop ids before min_new_tokens."""
    rows, ids = [], []
    for r, st in enumerate(states):
        banned = st.banned_ids()
        rows.extend([r] * len(banned)), ids.extend(banned)
    if rows:
        scores[torch.tensor(rows, device=scores.device), torch.tensor(ids, device=scores.device)] = NEG_INF


# ---- temperature: the one place logits are divided by it ----

def apply_temperature_(scores: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Divide rows by their temperature column [R, 1] in place, clamped to the float range (a small
    temperature after a tiny repetition penalty overflows, and one +inf makes a row's softmax NaN)."""
    return _no_overflow_(scores.div_(temperature))


def apply_temperatures_(scores: torch.Tensor, params: list[SamplingParams]) -> None:
    """Stage 6 in place: row i of ``scores`` divided by ``params[i].temperature`` (``apply_temperature_``); left
    untouched when every row's temperature is 1."""
    if any(p.temperature != 1.0 for p in params):
        apply_temperature_(scores, torch.tensor([p.temperature for p in params], device=scores.device)[:, None])


# ---- stage 7: truncation, each on [R, V] with per-row parameter columns ----

def top_k_(scores: torch.Tensor, k: torch.Tensor, presorted: bool = False) -> None:
    """Keep tokens >= the row's k-th largest logit (ties kept, as transformers)."""
    kth = (scores if presorted else scores.topk(int(k.max())).values).gather(1, k.long() - 1)
    scores.masked_fill_(scores < kth, NEG_INF)


class DescendingOrder:
    """Rows' token ids by descending logit: a topk head of `size` tokens, or a full sort.

    Later truncations only remove tails of this order, so one sort serves top-p and typical.
    """

    def __init__(self, scores: torch.Tensor, size: int):
        vocab = scores.shape[1]
        self.full = size * FULL_SORT_FRACTION >= vocab
        self.values, self.ids = scores.sort(-1, descending=True) if self.full else scores.topk(size)

    @classmethod
    def presorted(cls, scores: torch.Tensor) -> DescendingOrder:
        """The order of rows whose columns already descend (a top-k head): the identity."""
        order = cls.__new__(cls)
        order.full, order.values = True, scores
        order.ids = torch.arange(scores.shape[1], device=scores.device).expand_as(scores)
        return order

    def select(self, local_rows: torch.Tensor) -> DescendingOrder:
        """The order of a subset of rows."""
        picked = DescendingOrder.__new__(DescendingOrder)
        picked.full, picked.values, picked.ids = self.full, self.values[local_rows], self.ids[local_rows]
        return picked

    def make_full(self, scores: torch.Tensor) -> None:
        if not self.full:
            self.full = True
            self.values, self.ids = scores.sort(-1, descending=True)


def top_p_head_size(scores: torch.Tensor, p: torch.Tensor) -> int:
    """An upper bound on the tokens any row's top-p head holds, found without sorting.

    A histogram of log-probabilities in buckets below the top token: the first bucket where the
    cumulative mass reaches p ends the head, so the head is at most the tokens up to that bucket.
    """
    rows, vocab = scores.shape
    logp = scores - scores.logsumexp(-1, keepdim=True)
    depth = ((logp.amax(-1, keepdim=True) - logp) * HEAD_BUCKETS_PER_NAT).clamp_(max=HEAD_BUCKETS - 1).long()
    mass = torch.zeros(rows, HEAD_BUCKETS, device=scores.device).scatter_add_(1, depth, logp.exp_())
    reached = mass.double().cumsum(-1) >= p.double()
    last_bucket = reached.float().argmax(-1, keepdim=True)
    need = (depth <= last_bucket).sum(-1)
    need = torch.where(reached.any(-1), need, vocab)
    return min(vocab, int(need.max()) + HEAD_MARGIN)


def top_p_(scores: torch.Tensor, p: torch.Tensor, order: DescendingOrder) -> None:
    """Keep the smallest head whose mass reaches p: drop tokens whose exclusive prefix mass >= p."""
    log_z = scores.logsumexp(-1, keepdim=True)
    probs = (scores.gather(1, order.ids) - log_z).exp()
    cum = probs.cumsum(-1)
    if not order.full and bool((cum[:, -1:] < p).any()):  # rounding at a bucket edge: sort after all
        order.make_full(scores)
        probs = (scores.gather(1, order.ids) - log_z).exp()
        cum = probs.cumsum(-1)
    drop_sorted = (cum - probs) >= p
    drop_sorted[:, 0] = False
    drop = torch.ones_like(scores, dtype=torch.bool)  # outside a sufficient head: dropped
    drop.scatter_(1, order.ids, drop_sorted)
    scores.masked_fill_(drop, NEG_INF)


def min_p_(scores: torch.Tensor, min_p: torch.Tensor) -> None:
    probs = scores.softmax(-1)
    scores.masked_fill_(probs < min_p * probs.amax(-1, keepdim=True), NEG_INF)


def typical_(scores: torch.Tensor, mass: torch.Tensor, ids: torch.Tensor) -> None:
    """Locally typical sampling (Meister et al. 2022) using the shared descending order `ids`.

    In descending-logit order |-log p - H| falls then rises, so reversing the head gives two
    ascending runs, which a stable (merge) sort orders far faster than a fresh full sort.
    """
    vals = scores.gather(1, ids)  # still descending: earlier truncations dropped only tails
    logp = vals - scores.logsumexp(-1, keepdim=True)
    probs = logp.exp()
    entropy = -(logp * probs).nansum(-1, keepdim=True)  # -inf * 0 = nan counts as 0
    shifted = (logp + entropy).abs_()
    head = (logp >= -entropy).sum(-1, keepdim=True)  # tokens more likely than typical
    pos = torch.arange(vals.shape[1], device=vals.device).expand_as(vals)
    runs = torch.where(pos < head, head - 1 - pos, pos)
    by_shift = runs.gather(1, torch.sort(shifted.gather(1, runs), dim=-1, stable=True).indices)
    cum = probs.gather(1, by_shift).cumsum(-1)
    last = (cum < mass).sum(-1, keepdim=True).clamp_(max=vals.shape[1] - 1)
    threshold = shifted.gather(1, by_shift.gather(1, last))
    drop = torch.zeros_like(scores, dtype=torch.bool)
    drop.scatter_(1, ids, shifted > threshold)
    scores.masked_fill_(drop, NEG_INF)


def epsilon_(scores: torch.Tensor, eps: torch.Tensor) -> None:
    probs = scores.softmax(-1)
    scores.masked_fill_((probs < eps) & (scores < scores.amax(-1, keepdim=True)), NEG_INF)


def eta_(scores: torch.Tensor, eps: torch.Tensor) -> None:
    """Eta sampling (Hewitt et al. 2022): cutoff min(eps, sqrt(eps) * exp(-entropy))."""
    logp = scores.log_softmax(-1)
    eta = torch.minimum(eps, eps.sqrt() * torch.exp(-_entropy(logp)))
    scores.masked_fill_((logp.exp() < eta) & (scores < scores.amax(-1, keepdim=True)), NEG_INF)


def truncate_(scores: torch.Tensor, params: list[SamplingParams], presorted: bool = False) -> None:
    """top-k, top-p, min-p, typical, epsilon, eta in that order; each only on rows that use it.

    presorted: every row's columns already descend (a top-k head), so no transform sorts or topks.
    """
    dev, width = scores.device, scores.shape[1]
    rows = rows_where([0 < p.top_k < width for p in params], dev)
    if rows is not None:
        on_rows_(scores, rows, lambda s: top_k_(s, column([p.top_k for p in params], rows, torch.long), presorted))
    sort_rows = rows_where([p.top_p < 1.0 or p.typical_p < 1.0 for p in params], dev)
    if sort_rows is not None:
        sorted_params = [params[i] for i in sort_rows.tolist()]
        whole = sort_rows.numel() == scores.shape[0]  # every row sorts: work in place, no row copies
        sub = scores if whole else scores.index_select(0, sort_rows)
        if presorted:
            order = DescendingOrder.presorted(sub)
        elif any(p.typical_p < 1.0 for p in sorted_params):
            order = DescendingOrder(sub, sub.shape[1])
        else:
            top_p = column([p.top_p for p in sorted_params], torch.arange(len(sorted_params), device=dev))
            order = DescendingOrder(sub, top_p_head_size(sub, top_p))
        p_local = rows_where([p.top_p < 1.0 for p in sorted_params], dev)
        if p_local is not None:
            p_order = order if p_local.numel() == sub.shape[0] else order.select(p_local)
            on_rows_(sub, p_local, lambda s: top_p_(s, column([p.top_p for p in sorted_params], p_local), p_order))
        if not whole:
            scores.index_copy_(0, sort_rows, sub)
    rows = rows_where([p.min_p > 0.0 for p in params], dev)
    if rows is not None:
        on_rows_(scores, rows, lambda s: min_p_(s, column([p.min_p for p in params], rows)))
    if sort_rows is not None:
        t_local = rows_where([p.typical_p < 1.0 for p in sorted_params], dev)
        if t_local is not None:  # order is full here: any typical row asks for the full sort
            t_rows = sort_rows[t_local]
            on_rows_(scores, t_rows, lambda s: typical_(s, column([p.typical_p for p in params], t_rows), order.ids[t_local]))
    rows = rows_where([p.epsilon_cutoff > 0.0 for p in params], dev)
    if rows is not None:
        on_rows_(scores, rows, lambda s: epsilon_(s, column([p.epsilon_cutoff for p in params], rows)))
    rows = rows_where([p.eta_cutoff > 0.0 for p in params], dev)
    if rows is not None:
        on_rows_(scores, rows, lambda s: eta_(s, column([p.eta_cutoff for p in params], rows)))


# ---- mirostat (Basu et al. 2021), on temperature-scaled logits ----

def mirostat_v1_k(logp: torch.Tensor, mu: torch.Tensor, vocab: int) -> torch.Tensor:
    """Alg. 1: Zipf exponent s from the top m probabilities, then k = (e * 2^mu / (1 - N^-e))^(1/s), e = s - 1."""
    m = min(MIROSTAT_M, logp.shape[1])
    top = logp.topk(m).values.double()
    i = torch.arange(1, m, dtype=torch.float64, device=logp.device)
    t = torch.log((i + 1) / i)  # t_i = log((i+1)/i)
    b = top[:, :-1] - top[:, 1:]  # b_i = log(p_i / p_{i+1})
    usable = torch.isfinite(b)  # rows with fewer than m live tokens use the pairs they have
    s = (torch.where(usable, t * b, 0).sum(-1) / torch.where(usable, t * t, 0).sum(-1).clamp_min(1e-12)).clamp_min(1e-6)
    e = s - 1
    two_mu = torch.pow(2.0, mu.double())
    ratio = torch.where(e.abs() > 1e-9, e * two_mu / (1 - torch.pow(float(vocab), -e)), two_mu / math.log(vocab))
    k = torch.pow(ratio, 1 / s)
    return torch.nan_to_num(k, nan=float(vocab), posinf=float(vocab)).round().clamp(1, vocab).long()


def mirostat_(scores: torch.Tensor, modes: list[int], mu: torch.Tensor) -> None:
    """Truncate in place: v1 keeps the top k(mu); v2 keeps tokens with surprise -log2 p <= mu (and the top one)."""
    logp = scores.log_softmax(-1)
    v1 = torch.tensor([m == 1 for m in modes], device=scores.device)[:, None]
    drop = (logp < -mu * LN2) & (scores < scores.amax(-1, keepdim=True))  # v2 rule
    if bool(v1.any()):
        k = mirostat_v1_k(logp, mu[:, 0], scores.shape[1])[:, None]
        kth = scores.topk(int(k.max())).values.gather(1, k - 1)
        drop = torch.where(v1, scores < kth, drop)
    scores.masked_fill_(drop, NEG_INF)


# ---- stage 8: drawing ----

def draw_(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """One uniform per row from the row's own generator, inverse CDF over the row's probabilities.

    One number per row per step keeps each request's stream independent of its batch-mates and
    costs microseconds (an exponential race draws V numbers: ~0.9 ms per row at V=49152 on CPU).
    """
    u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators]).to(probs.device)
    cdf = probs.cumsum(-1, dtype=torch.float64)  # the same sums as .double().cumsum(), without the copy
    target = (u * cdf[:, -1])[:, None]  # u < 1, so target < total: the chosen token has p > 0
    return torch.searchsorted(cdf, target, right=True).clamp_(max=probs.shape[1] - 1)[:, 0]


# ---- top-k heads: rows with top-k sampled from their top_k (+ spare) tokens only ----

def head_rows(params: list[SamplingParams], vocab: int) -> list[int]:
    """Rows a top-k head serves: plain truncation (no mirostat) and a head well below a full sort's cost."""
    return [j for j, p in enumerate(params)
            if p.mirostat_mode == 0 and p.top_k > 0 and (p.top_k + HEAD_SPARE) * FULL_SORT_FRACTION <= vocab]


def head_distributions(scores: torch.Tensor, params: list[SamplingParams]
                       ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """Stages 6-7 of rows of scores[R, V] on each row's head (see ``sample_heads``): (rows served, the
    head's probabilities [S, H] and token ids [S, H], in ascending token-id order)."""
    k = torch.tensor([p.top_k for p in params], device=scores.device)[:, None]
    values, ids = top_head(scores, int(k.max()) + HEAD_SPARE)  # == scores.topk(...), faster
    apply_temperatures_(values, params)
    fits = (values[:, -1] < values.gather(1, k - 1)[:, 0]).tolist()  # the token after the head is below the k-th
    served = [j for j, f in enumerate(fits) if f]
    if not served:
        return served, values[:0], ids[:0]
    if len(served) < len(params):
        at = torch.tensor(served, device=scores.device)
        values, ids = values[at], ids[at]
    truncate_(values, [params[j] for j in served], presorted=True)
    ids_ascending, by_id = ids.sort(-1)  # draw_ walks the CDF in token-id order, as over the full row
    return served, values.softmax(-1).gather(1, by_id), ids_ascending


def sample_heads(scores: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator]) -> tuple[list[int], torch.Tensor]:
    """Draw for rows of scores[R, V] (before temperature) from each row's head; returns (rows served, tokens).

    A row is served when its head holds every token the full path keeps (all tokens >= its k-th
    value), then its token is the one the full path draws: the same values (dividing by T > 0 keeps
    the order, so topk may come first), truncations on the same survivors, and draw_ over them in
    token-id order. Rows not served (ties at the k-th value reaching past the head) are left to the caller.
    """
    served, probs, ids_ascending = head_distributions(scores, params)
    if not served:
        return served, ids_ascending[:0, 0]
    at = draw_(probs, [generators[j] for j in served])
    return served, ids_ascending.gather(1, at[:, None])[:, 0]
