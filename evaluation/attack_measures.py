"""The measurements of ``evaluation.security_attacks``, one function per attack, and their plots.

Each takes the run, the scheme's label, the attacker's ``ColourEstimate`` from N stolen tokens and the
held-out generations, and returns a JSON-able section of results.json.
"""

from __future__ import annotations

import random

import numpy as np

from db.output_grams import GramIndex, output_grams, text_grams
from detector import common_units
from detector.normalize import normalize
from detector.spoof_check import SPOOF_ALPHA, OutputCounts, SpoofNull, spoof_check
from evaluation.attacks import AttackContext, get_attack
from evaluation.metrics import summary
from evaluation.spoofing import SpoofMark, scrub_edit, spoof_edit
from evaluation.stealing import colour_accuracy

Z_SUCCESS = 4.0  # the detector's default threshold: a spoof succeeds at z >= 4


def _truth_units(mark, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    units = mark.ngrams(ids).numpy()
    return units, mark.green_flags(ids).numpy()


def stealing(run, label: str, estimate, held: dict, n: int) -> dict:
    """Accuracy of the stolen colours on the units of held-out texts, unwatermarked and watermarked."""

    mark = run.marks[label]
    namer = getattr(estimate, "mark", None)  # a thief that names units (learned anchors, or told them)
    out = {"tokens": estimate.counts.tokens, "pairs_supported": int(len(estimate.keys))}
    for name in ("unwatermarked", label):
        units, truth = zip(*(_truth_units(mark, run.encode(g.text)) for g in held[name]))
        units = np.concatenate(units)
        section = out["on_" + ("unwatermarked" if name == "unwatermarked" else "watermarked")] = colour_accuracy(
            estimate, units, np.concatenate(truth))
        if namer is not None and len(units):  # every position, not distinct units: how often it names the right one
            section["positions_named_right"] = float(np.mean(namer.ngram_identities(units) == mark.ngram_identities(units)))
    return out


def _summary(scored: list[dict], matched: list[bool] | None = None) -> dict:
    """Detection rate, z >= 4 and median z; with ``matched`` (the texts that repeat a remembered output,
    ``remembered``) also how many match and how many are detected or match (``matches_own_output``)."""
    z = [s["z"] for s in scored if s["z"] is not None]
    out = {"n": len(scored), "success_rate": float(np.mean([s["detected"] for s in scored])) if scored else None,
           "z_at_least_4": float(np.mean([s["z"] is not None and s["z"] >= Z_SUCCESS for s in scored])) if scored else None,
           "median_z": float(np.median(z)) if z else None}
    if matched is not None and scored:
        out["matches_own_output"] = float(np.mean(matched))
        out["detected_or_matched"] = float(np.mean([s["detected"] or m for s, m in zip(scored, matched)]))
    return out


GRAM_KEY = 0x5EC0_0D5E  # the run's n-gram hash key (the service derives its own from the master key)


def remembered(run, label: str, held: dict):
    """A function text -> whether it repeats an output the service remembers (``db.output_grams``): every
    watermarked output of this key, the training corpus and the held-out texts, with their prompts left out."""
    key = f"_remembered_{label}"
    if getattr(run, key, None) is None:
        index = GramIndex()
        for row, g in enumerate(run.training_texts()[label] + held[label]):
            index.add(row, output_grams(run.encode(normalize(g.text).text), g.prompt_ids, GRAM_KEY))
        setattr(run, key, index)
    index = getattr(run, key)

    def matches(texts: list[str]) -> list[bool]:
        found = [index.match(text_grams(run.encode(normalize(t).text), GRAM_KEY)) for t in texts]
        return [m is not None and m.matches for m in found]
    return matches


def spoofing(run, label: str, estimate, held: dict, n: int) -> dict:
    """Steered generation and edited human text, scored by the production detector."""

    cfg = run.config
    generated = spoof_generations(run, {(label, n): estimate})[label, n]
    out = {"delta": cfg.spoof_delta, "generated": _summary(run.detect(label, [g.text for g in generated])),
           "generated_perplexity": summary([g.perplexity for g in generated])["median"],
           "unwatermarked_perplexity": summary([g.perplexity for g in held["unwatermarked"]])["median"]}
    logits = _human_logits(run)
    edits = {}
    for rate in cfg.rates:
        rng = random.Random(f"{cfg.seed}|spoof-edit|{label}|{n}|{rate}")
        texts = [run.decode(spoof_edit(estimate, ids, rows, list(range(1, len(ids))), rate, rng))
                 for ids, rows in zip(run.human_ids, logits)]
        edits[f"{rate:g}"] = _summary(run.detect(label, texts))
    out["human_edited"] = edits
    out["spoof_check"] = _spoof_check(run, label, [g.text for g in generated], [g.text for g in held[label]])
    return out


SPOOF_CHECK_ALPHAS = (0.05, 0.01, 0.001)  # empirical p needs 1 / alpha null texts; the normal fit does not


def _spoof_check(run, label: str, spoofed: list[str], genuine: list[str]) -> dict:
    """The spoof check (``detector.spoof_check``) with the service's own output as its memory: the whole
    watermarked training corpus of this key (what the generation API emitted), its null from each of
    those outputs left out in turn. Reported: how often spoofed texts (all; those the detector accepted)
    and held-out genuine ones reach each alpha of that null."""
    mark, common = run.marks[label], common_units.for_vocabulary(run.vocab)
    outputs = [run.encode(g.text) for g in run.training_texts()[label]]
    counts = OutputCounts()
    for ids in outputs:
        counts.add(mark.unit_identities(ids))
    null = SpoofNull([c.z for c in (spoof_check(mark, ids, common, counts, leave_out=True) for ids in outputs)
                      if c is not None])
    detected = [s["detected"] for s in run.detect(label, spoofed)]

    def rates(texts: list[str], keep: list[bool] | None = None) -> dict:
        checks = [spoof_check(mark, run.encode(t), common, counts) for t in texts]
        if keep is not None:
            checks = [c for c, k in zip(checks, keep) if k]
        z = [c.z if c is not None else float("nan") for c in checks]
        out = {"n": len(z), "median_z": summary(z)["median"]}
        for a in SPOOF_CHECK_ALPHAS:
            out[f"flagged_at_{a:g}"] = float(np.mean([null.p_value(v) <= a for v in z])) if z else None
            out[f"flagged_at_{a:g}_normal_fit"] = float(np.mean([null.p_value_normal(v) <= a for v in z])) if z else None
        return out

    spoofed_z = [c.z if c is not None else float("nan") for c in
                 (spoof_check(mark, run.encode(t), common, counts) for t in spoofed)]
    # what the service would have accepted as ours with the spoof check on: watermarked, not spoof_suspected
    passed = [d and not null.p_value_normal(z) <= SPOOF_ALPHA for d, z in zip(detected, spoofed_z)]
    return {"outputs_in_memory": counts.outputs, "null_texts": int(null.z.shape[0]),
            "spoof_alpha": SPOOF_ALPHA, "success_with_spoof_check": float(np.mean(passed)) if passed else None,
            "null_median_z": float(np.median(null.z)) if null.z.size else None,
            "spoofed": rates(spoofed), "spoofed_detected": rates(spoofed, detected), "genuine": rates(genuine)}


def spoof_generations(run, estimates: dict) -> dict:
    """{(label, N): the base model steered by that stolen table on the held-out prompts} (cached)."""

    cfg = run.config
    keys = list(estimates)
    marks = [(SpoofMark(estimates[k], cfg.spoof_delta, f"{k[0]}-n{k[1]}"), None) for k in keys]
    found = run.source.generate_sets(run.eval_prompts, cfg.tokens, 1.0, cfg.seed + 2000, marks, label="spoofed texts")
    return dict(zip(keys, found))


def _human_logits(run):
    if getattr(run, "_human_logits", None) is None:
        run._human_logits = run.lm.next_token_logits(run.human_ids, [list(range(1, len(i))) for i in run.human_ids])
    return run._human_logits


def scrubbing(run, label: str, estimate, held: dict, n: int) -> dict:
    """TPR of held-out watermarked texts after stolen-colour edits vs blind model edits, per rate."""

    cfg = run.config
    texts = [g.text for g in held[label]]
    ids = [run.encode(t) for t in texts]
    prompts = [g.prompt_ids for g in held[label]]
    key = f"_scrub_logits_{label}"
    if getattr(run, key, None) is None:  # logits at every text position, given prompt and text before it
        full = run.lm.next_token_logits([p + i for p, i in zip(prompts, ids)],
                                        [list(range(len(p), len(p) + len(i))) for p, i in zip(prompts, ids)])
        setattr(run, key, full)
    logits = getattr(run, key)
    blind_attack = get_attack("token-substitute-lm")
    context = AttackContext(run.vocab.tokenizer, lm=run.lm)
    matches = remembered(run, label, held)  # the service remembers what it wrote: matches_own_output
    clean = _summary(run.detect(label, texts), matches(texts))
    rows = {"0": {**clean, "blind": dict(clean)}}
    for rate in cfg.rates:
        rng = random.Random(f"{cfg.seed}|scrub|{label}|{n}|{rate}")
        stolen = [run.decode(scrub_edit(estimate, i, lg, list(range(len(i))), rate, rng)) for i, lg in zip(ids, logits)]
        blind = blind_attack.apply(texts, rate, cfg.seed, context)
        rows[f"{rate:g}"] = {**_summary(run.detect(label, stolen), matches(stolen)),
                             "blind": _summary(run.detect(label, blind), matches(blind))}
    return {"by_rate": rows}


def control(run, label: str, held: dict) -> dict:
    """What the detector says with no attack: unwatermarked held-out text (the spoof baseline) and human text."""
    matches = remembered(run, label, held)
    texts = {"unwatermarked": [g.text for g in held["unwatermarked"]], "human": [run.decode(i) for i in run.human_ids],
             "watermarked": [g.text for g in held[label]]}
    return {name: _summary(run.detect(label, t), matches(t)) for name, t in texts.items()}


def plot(results: dict, config, out) -> list[str]:
    import matplotlib  # noqa: PLC0415 (matplotlib, heavy: loaded only to draw the plots)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (after choosing the Agg backend)

    labels = [k for k in results if isinstance(results[k], dict) and k not in ("config",)
              and any(k2.isdigit() for k2 in results[k])]
    names = []

    def sections(label, attack):
        return [(int(n), s[attack]) for n, s in sorted(results[label].items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else -1)
                if n.isdigit() and attack in s]

    def figure(name: str, xlabel: str, ylabel: str, log_x: bool, draw) -> None:
        """One plot: ``draw(ax)``, the shared dressing, saved as OUT/name."""
        fig, ax = plt.subplots(figsize=(5, 3.5))
        draw(ax)
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        names.append(name)

    def stealing(ax):
        for lb in labels:
            pts = sections(lb, "stealing")
            ax.plot([n for n, _ in pts], [s["on_unwatermarked"]["balanced_accuracy_known"] for n, s in pts], marker="o",
                    label=f"{lb}: balanced acc. (estimated units)")
            ax.plot([n for n, _ in pts], [s["on_unwatermarked"]["coverage"] for n, s in pts], marker="x", linestyle="--",
                    label=f"{lb}: coverage")

    def spoofing(ax):
        top = f"{max(config.rates):g}"
        for lb in labels:
            pts = sections(lb, "spoofing")
            line, = ax.plot([n for n, _ in pts], [s["generated"]["success_rate"] for n, s in pts], marker="o",
                            label=f"{lb}: steered model")
            checked = [(n, s["spoof_check"]["success_with_spoof_check"]) for n, s in pts
                       if s.get("spoof_check", {}).get("success_with_spoof_check") is not None]
            if checked:  # what the service accepts with the spoof check on (not spoof_suspected)
                ax.plot([n for n, _ in checked], [v for _, v in checked], marker="s", linestyle=":",
                        color=line.get_color(), label=f"{lb}: steered model, not spoof_suspected")
            ax.plot([n for n, _ in pts], [s["human_edited"][top]["success_rate"] for n, s in pts], marker="x",
                    linestyle="--", label=f"{lb}: human text, {top} edited")

    def scrubbing(ax):
        for lb in labels:
            pts = sections(lb, "scrubbing")
            if not pts:
                continue
            n, best = pts[-1]
            rates = sorted(best["by_rate"], key=float)
            line, = ax.plot([float(r) for r in rates], [best["by_rate"][r]["success_rate"] for r in rates], marker="o",
                            label=f"{lb}: stolen colours, N={n}")
            ax.plot([float(r) for r in rates], [best["by_rate"][r]["blind"]["success_rate"] for r in rates], marker="x",
                    linestyle="--", color=line.get_color(), label=f"{lb}: blind edits")
            if "detected_or_matched" in best["by_rate"][rates[0]]:  # runs before matches_own_output lack it
                ax.plot([float(r) for r in rates], [best["by_rate"][r]["detected_or_matched"] for r in rates],
                        marker="s", linestyle=":", color=line.get_color(),
                        label=f"{lb}: stolen colours, detected or matches_own_output")

    if any(sections(lb, "stealing") for lb in labels):
        figure("stealing_accuracy.png", "stolen watermarked tokens N", "fraction", True, stealing)
    if any(sections(lb, "spoofing") for lb in labels):
        figure("spoofing_success.png", "stolen watermarked tokens N", "spoof success (detected as ours)", True, spoofing)
    if any(sections(lb, "scrubbing") for lb in labels):
        figure("scrubbing_tpr.png", "edit rate (fraction of tokens replaced)", "TPR (detected)", False, scrubbing)
    return names
