"""Which learnability the spoof check should correlate the green flags with, on a finished ``provmark eval
security`` run (docs/security.md, "The anchor-aware thief"): the shipped x = log(count + 1/2) against
saturating forms log(min(count, C) + 1/2), steps 1[count >= C] and a scan (the largest z over several caps,
its null the same scan over the key's own outputs).

A thief knows a unit's colour once it has seen the unit a few times; beyond that, more sightings teach it
nothing, while genuine output leans a little towards its own frequent green units. So a covariate that keeps
growing with the count spends variance where the spoof and the genuine output do not differ.

    python research/scripts/spoof_covariates.py --run RUN --estimator known-units --steal-tokens 300000 \
        --eval-texts 80 --rates 0.2,0.3 [--levels 0.001,0.01] [--edits 0.1,0.2]

The flags must be the run's own (they name its cache); nothing is generated that the run did not cache, except
the blind edits of the genuine held-out outputs. JSON out: per covariate and level, the spoofs the detector
accepts that the check lets through, and the genuine outputs (fresh and blindly edited) it flags.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from spoof_level_trade import run_settings  # the sibling script (research/scripts is on the path)

from detector import common_units
from detector.spoof_check import OutputCounts, SpoofNull, counted_units, spoof_statistic
from evaluation import attack_measures as measure
from evaluation.attacks import AttackContext, get_attack
from evaluation.security_attacks import AttackRun

CAPS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SCAN = (2, 8, 32, 128, math.inf)


def covariates() -> dict:
    forms = {"log": lambda c: np.log(c + 0.5)}
    for cap in CAPS:
        forms[f"log-cap-{cap}"] = lambda c, cap=cap: np.log(np.minimum(c, cap) + 0.5)
        forms[f"step-{cap}"] = lambda c, cap=cap: (c >= cap).astype(np.float64)
    return forms


def z_of(form, y: np.ndarray, seen: np.ndarray) -> float:
    z = spoof_statistic(y, form(seen)).z
    return z if math.isfinite(z) else float("nan")


def scan_z(y: np.ndarray, seen: np.ndarray) -> float:
    found = [spoof_statistic(y, np.log(np.minimum(seen, cap) + 0.5)).z for cap in SCAN]
    found = [z for z in found if math.isfinite(z)]
    return max(found) if found else float("nan")


def main(argv: list[str] | None = None) -> int:
    settings = run_settings(argv, __doc__.split("\n\n")[0], "known-units", "300000", "0.001,0.01", "0.1,0.2")
    if isinstance(settings, int):
        return settings
    args, config, levels, edits = settings
    run = AttackRun(config, Path(args.run), progress=False)
    forms = covariates()
    try:
        out = {}
        for label, mark in run.marks.items():
            common = common_units.for_vocabulary(run.vocab)
            corpus = run.training_texts()[label]
            held = run.held_out()
            estimates = {(label, n): run.estimate(label, corpus, n) for n in config.steal_tokens}
            spoofed = measure.spoof_generations(run, estimates)
            counts = OutputCounts()
            outputs = [run.encode(g.text) for g in corpus]
            for ids in outputs:
                counts.add(mark.unit_identities(ids))

            def units_of(ids, leave_out: bool = False, without=None):
                y, counted, identities = counted_units(mark, ids, common)
                if y.shape[0] < 16:
                    return None
                seen = counts.of(identities, identities if leave_out else without)[counted]
                return y, seen

            def zs(pairs) -> dict[str, np.ndarray]:
                found = {name: np.array([z_of(f, *p) if p is not None else np.nan for p in pairs]) for name, f in forms.items()}
                found["scan"] = np.array([scan_z(*p) if p is not None else np.nan for p in pairs])
                return found

            nulls = {name: SpoofNull(z[np.isfinite(z)]) for name, z in zs([units_of(i, True) for i in outputs]).items()}

            def p_values(texts: list[str], without=None) -> dict[str, np.ndarray]:
                found = zs([units_of(run.encode(t), without=None if without is None else without[i])
                            for i, t in enumerate(texts)])
                return {name: np.array([nulls[name].p_value_normal(v) for v in z]) for name, z in found.items()}

            spoofs = {n: [g.text for g in spoofed[label, n]] for n in config.steal_tokens}
            detected = {n: np.array([d["detected"] for d in run.detect(label, t)]) for n, t in spoofs.items()}
            spoof_p = {n: p_values(t) for n, t in spoofs.items()}
            genuine = [g.text for g in held[label]]
            genuine_p = p_values(genuine)
            # the service remembered them when it wrote them; an edited copy it recognises (matches_own_output: every
            # one at these rates, docs/security.md) is checked against the counts without its original, as served
            owned = [mark.unit_identities(run.encode(text)) for text in genuine]
            for identities in owned:
                counts.add(identities)
            blind, context = get_attack("token-substitute-lm"), AttackContext(run.vocab.tokenizer, lm=run.lm)
            edited_p = {rate: p_values(blind.apply(genuine, rate, config.seed, context), owned) for rate in edits}
            table = {}
            for name in nulls:
                table[name] = {f"{a:g}": {
                    "spoofs_accepted_not_suspected": {str(n): float(np.mean(detected[n] & ~(spoof_p[n][name] <= a)))
                                                      for n in config.steal_tokens},
                    "genuine_flagged": float(np.mean(genuine_p[name] <= a)),
                    "genuine_edited_flagged": {f"{r:g}": float(np.mean(p[name] <= a)) for r, p in edited_p.items()},
                } for a in levels}
            out[label] = {"detected": {str(n): float(np.mean(d)) for n, d in detected.items()},
                          "null_outputs": len(outputs), "covariates": table}
    finally:
        run.close()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
