"""What the spoof check's level trades, on a finished ``provmark eval security`` run (docs/security.md):
spoofs the detector accepts and the check lets through, against genuine output the check calls a spoof,
fresh and after a user's blind edits of it (once the service has remembered it, as it does), also as the
detector checks an edited output it recognises (``matches_own_output``): against the counts without it.

    python research/scripts/spoof_level_trade.py --run RUN --estimator known-units --steal-tokens 100000,300000 \
        --eval-texts 80 --rates 0.2,0.3 [--levels 0.001,0.01,0.05] [--edits 0.05,0.1,0.2]

The flags must be the run's own (they name its cache); nothing is generated that the run did not cache,
except the blind edits. JSON out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from detector import common_units
from detector.spoof_check import OutputCounts, SpoofNull, spoof_check
from evaluation import attack_measures as measure
from evaluation.attacks import AttackContext, get_attack
from evaluation.security_attacks import AttackConfig, AttackRun


def run_settings(argv: list[str] | None, description: str, estimator: str, steal_tokens: str, levels: str,
                 edits: str):
    """The options every script reading a finished run takes (its own flags name its cache): (args, the run's
    ``AttackConfig``, spoof levels, blind edit rates), or 2 after a message on a bad option."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--run", required=True, help="the run's --out folder")
    parser.add_argument("--schemes", default="default")
    parser.add_argument("--estimator", default=estimator)
    parser.add_argument("--steal-tokens", default=steal_tokens)
    parser.add_argument("--eval-texts", type=int, default=80)
    parser.add_argument("--rates", default="0.2,0.3")
    parser.add_argument("--levels", default=levels)
    parser.add_argument("--edits", default=edits)
    args = parser.parse_args(argv)
    if not (Path(args.run) / "results.json").is_file():
        print(f"--run: no results.json in {args.run}", file=sys.stderr)
        return 2
    try:
        config = AttackConfig(attacks=("stealing", "spoofing", "scrubbing"),
                              schemes=tuple(s for s in args.schemes.split(";") if s.strip()),
                              steal_tokens=tuple(int(float(n)) for n in args.steal_tokens.split(",")),
                              eval_texts=args.eval_texts, rates=tuple(float(r) for r in args.rates.split(",")),
                              estimator=args.estimator)
        return args, config, [float(a) for a in args.levels.split(",")], [float(r) for r in args.edits.split(",")]
    except ValueError as exc:
        print(f"bad option: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    settings = run_settings(argv, __doc__.split("\n\n")[0], "pairs", "100000,300000", "0.001,0.01,0.05",
                            "0.05,0.1,0.2")
    if isinstance(settings, int):
        return settings
    args, config, levels, edits = settings
    run = AttackRun(config, Path(args.run), progress=False)
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
            null = SpoofNull([c.z for c in (spoof_check(mark, ids, common, counts, leave_out=True) for ids in outputs)
                              if c is not None])

            def p_values(texts: list[str]) -> np.ndarray:
                checks = [spoof_check(mark, run.encode(t), common, counts) for t in texts]
                return np.array([null.p_value_normal(c.z) if c is not None else 1.0 for c in checks])

            def detected(texts: list[str]) -> np.ndarray:
                return np.array([d["detected"] for d in run.detect(label, texts)])

            spoofs = {n: [g.text for g in spoofed[label, n]] for n in config.steal_tokens}
            spoof_p = {n: (p_values(t), detected(t)) for n, t in spoofs.items()}
            genuine = [g.text for g in held[label]]
            genuine_p = p_values(genuine)
            for text in genuine:  # the service remembered them when it wrote them
                counts.add(mark.unit_identities(run.encode(text)))
            blind, context = get_attack("token-substitute-lm"), AttackContext(run.vocab.tokenizer, lm=run.lm)
            edited = {rate: blind.apply(genuine, rate, config.seed, context) for rate in edits}
            edited_p = {rate: p_values(texts) for rate, texts in edited.items()}
            remembered = measure.remembered(run, label, held)  # the service's n-gram memory of the same outputs
            owned = {i: mark.unit_identities(run.encode(text)) for i, text in enumerate(genuine)}

            def p_values_as_served(texts: list[str]) -> np.ndarray:
                """The check as the detector runs it: an edited output it recognises, without that output."""
                out = []
                for i, (text, matched) in enumerate(zip(texts, remembered(texts))):
                    check = spoof_check(mark, run.encode(text), common, counts, without=owned[i] if matched else None)
                    out.append(null.p_value_normal(check.z) if check is not None else 1.0)
                return np.array(out)

            served_p = {rate: p_values_as_served(texts) for rate, texts in edited.items()}
            matched = {rate: float(np.mean(remembered(texts))) for rate, texts in edited.items()}
            out[label] = {f"{a:g}": {
                "spoofs_accepted_not_suspected": {str(n): float(np.mean(d & ~(p <= a))) for n, (p, d) in spoof_p.items()},
                "genuine_flagged": float(np.mean(genuine_p <= a)),
                "genuine_edited_flagged": {f"{r:g}": float(np.mean(p <= a)) for r, p in edited_p.items()},
                "genuine_edited_flagged_as_served": {f"{r:g}": float(np.mean(p <= a)) for r, p in served_p.items()},
            } for a in levels}
            out[label]["genuine_edited_matches_own_output"] = {f"{r:g}": v for r, v in matched.items()}
    finally:
        run.close()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
