"""What ``provmark eval security`` runs (``api.cli.evaluate`` registers its options): which attacks, their
settings from the flags, and the stealing / spoofing / scrubbing run with its headline output."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from evaluation import public_half
from evaluation.security import run_security
from evaluation.security_attacks import ATTACKS, AttackConfig, run_attacks

ORACLE = "oracle"
PUBLIC_HALF = "public-half"  # a two-part key against a spoofer holding its published half (evaluation.public_half)


def wanted_attacks(text: str) -> tuple[bool, tuple[str, ...]]:
    """``--attack`` -> (run the oracle attack?, the stealing attacks to run); ValueError on unknown names.
    ``public-half`` is accepted here and asked for with ``wants_public_half``."""
    names = [part.strip().lower() for part in str(text).split(",") if part.strip()]
    if not names:
        raise ValueError("expected an attack name")
    if "all" in names:
        return True, ATTACKS
    unknown = [n for n in names if n not in (ORACLE, PUBLIC_HALF) and n not in ATTACKS]
    if unknown:
        raise ValueError(f"unknown {', '.join(map(repr, unknown))} "
                         f"(known: {ORACLE}, {', '.join(ATTACKS)}, {PUBLIC_HALF}, all)")
    return ORACLE in names, tuple(n for n in ATTACKS if n in names)


def wants_public_half(text: str) -> bool:
    names = [part.strip().lower() for part in str(text).split(",")]
    return PUBLIC_HALF in names or "all" in names


def public_half_config(args):
    """The public-half run's settings from the flags (``evaluation.public_half.PublicHalfConfig``): the spoofer
    at our own strength and at --spoof-delta. ValueError naming the setting."""
    deltas = tuple(sorted({public_half.PublicHalfConfig().spec_delta, float(args.spoof_delta)}))
    return public_half.PublicHalfConfig(texts=args.eval_texts, tokens=args.tokens, seed=args.seed, spoof_deltas=deltas)


def run_public_half(args, config) -> int:
    """The two-part key against its published half's spoofer (``evaluation.public_half``), into OUT/public-half."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    results = public_half.run_public_half(config, Path(args.out) / PUBLIC_HALF, progress=not args.no_progress)
    print(json.dumps({name: section[str(args.tokens)] for name, section in results["sets"].items()}, indent=1))
    print(f"results: {args.out}/{PUBLIC_HALF}/results.json; plot: {results['plot']}")
    return 0


def _numbers(flag: str, text: str, kind):
    try:
        return tuple(kind(float(part)) if kind is int else kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated numbers, got {text!r}") from None


def stealing_config(args, attacks: tuple[str, ...]):
    """The AttackConfig the flags ask for; ValueError naming the flag (the CLI turns it into its error)."""

    try:
        steal = _numbers("--steal-tokens", args.steal_tokens, int)
        if any(float(p) != int(float(p)) for p in args.steal_tokens.split(",") if p.strip()):
            raise ValueError(f"--steal-tokens: expected whole numbers, got {args.steal_tokens!r}")
        return AttackConfig(attacks=attacks, steal_tokens=steal,
                            schemes=tuple(s.strip() for s in args.schemes.split(";") if s.strip()),
                            tokens=args.tokens, eval_texts=args.eval_texts, rates=_numbers("--rates", args.rates, float),
                            spoof_delta=args.spoof_delta, seed=args.seed, estimator=args.estimator)
    except ValueError as exc:
        message = str(exc)
        for name in ("steal_tokens", "eval_texts", "spoof_delta", "max_num_seqs"):
            message = message.replace(name, "--" + name.replace("_", "-"))
        if message.startswith(("schemes", "tokens", "rates", "estimator")):
            message = "--" + message
        raise ValueError(message) from None


def run_stealing_attacks(args, config, oracle_config=None) -> int:
    """Run ``config`` (from ``stealing_config``); with an ``oracle_config`` (an ``evaluation.security.SecurityConfig``)
    the oracle attack first, into OUT/oracle. ``--threads`` must have been checked by the caller."""

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if oracle_config is not None:
        found = run_security(oracle_config, Path(args.out) / ORACLE, progress=not args.no_progress)
        print(json.dumps(found["summary"], indent=1))
    results = run_attacks(config, args.out, progress=not args.no_progress)
    print(json.dumps(headline(results), indent=1))
    print(f"results: {args.out}/results.json; plots: {', '.join(results.get('plots', []))}")
    return 0


def headline(results: dict) -> dict:
    """Per scheme and N: colour accuracy, spoof success, and scrubbing vs blind at the largest rate."""
    out = {}
    for label, by_n in results.items():
        if not isinstance(by_n, dict) or label in ("config",):
            continue
        for n, section in by_n.items():
            if not n.isdigit():
                continue
            row = {}
            if "stealing" in section:
                row["colour_balanced_accuracy"] = section["stealing"]["on_unwatermarked"].get("balanced_accuracy_known")
                row["coverage"] = section["stealing"]["on_unwatermarked"]["coverage"]
            if "spoofing" in section:
                row["spoof_success"] = section["spoofing"]["generated"]["success_rate"]
                row["spoof_success_with_spoof_check"] = section["spoofing"].get("spoof_check", {}).get("success_with_spoof_check")
            if "scrubbing" in section:
                top = max(section["scrubbing"]["by_rate"], key=float)
                cell = section["scrubbing"]["by_rate"][top]
                row[f"tpr_at_rate_{top}"] = {"stolen": cell["success_rate"], "blind": cell["blind"]["success_rate"]}
            out[f"{label} N={n}"] = row
    return out
