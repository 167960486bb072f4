"""``provmark eval robustness``: how the watermark survives edits, and what it costs in quality.

    provmark eval robustness [--n 200] [--tokens 200] [--schemes default,lefthash,...]
                             [--attacks all|fast|NAME,...] [--rates 0,0.1,0.25,0.5] [--out DIR]
                             [--key ID] [--deltas 1,4] [--null-keys 2] [--seed 0] [--model DIR]
                             [--lengths 50,100,200,400] [--exact-fprs 1e-3,1e-5]

Writes DIR/results.json and the plots (PNG) into DIR; generations are cached in DIR/cache, so
running the same command again resumes where it stopped. ``--schemes`` takes preset names
(default, selfhash, minhash, lefthash, unigram, kirchenbauer2023, gumbel, synthid; ``compare`` for
every KGW scheme, Gumbel and SynthID side by side) separated by commas, or full spec strings separated
by semicolons. ``--lengths`` adds, per scheme, detection at exact false-positive rates (``--exact-fprs``),
repetition and diversity of the clean texts' first L tokens, with a comparison plot per metric.
The keyring's active key watermarks unless ``--key`` names another (a first key is created on an
empty keyring). Small ``--n`` and ``--tokens`` still produce
every table and plot.
"""

from __future__ import annotations

import argparse
import json

import torch

from api.cli.errors import CLIError
from db.budget import DEFAULT_DAILY_TOKENS
from generation.models import load_model
from watermark.key_info import KeyringError
from watermark.keys import Keyring
from watermark.vocab import ModelAssetError


def register(subparsers) -> None:
    group = subparsers.add_parser("eval", help="evaluate the watermark (robustness under edits)")
    commands = group.add_subparsers(dest="eval_command", metavar="EVALUATION")
    p = commands.add_parser("robustness", help="detection under edits, per scheme x attack x rate, with plots",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=200, help="prompts (texts per scheme), default 200")
    p.add_argument("--tokens", type=int, default=200, help="tokens per generated text, default 200")
    p.add_argument("--schemes", action="append", metavar="LIST",
                   help="preset names (comma-separated) or spec strings (semicolon-separated); default: default")
    p.add_argument("--attacks", default="all", metavar="LIST",
                   help="attack names (comma-separated), 'all' (default) or 'fast' (no model-driven attacks)")
    p.add_argument("--rates", default="0,0.1,0.25,0.5", metavar="LIST", help="edit rates, default 0,0.1,0.25,0.5")
    p.add_argument("--out", default="eval-robustness", metavar="DIR", help="output folder (default eval-robustness)")
    p.add_argument("--key", metavar="ID", help="keyring key that watermarks (default: the active key)")
    p.add_argument("--deltas", default="", metavar="LIST",
                   help="extra deltas of the first scheme for the quality-vs-delta plot (e.g. 1,4)")
    p.add_argument("--null-keys", type=int, default=2, metavar="K",
                   help="fresh keys every text is also scored with, as negatives (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of prompts' sampling and of the attacks (default 0)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    p.add_argument("--max-num-seqs", type=int, default=32, help="sequences generated at once (default 32)")
    for flag, default, what in (("--lengths", "", "token counts L (each <= --tokens) at which the clean texts are "
                                                  "measured, e.g. 50,100,200,400"),
                                ("--exact-fprs", "1e-3,1e-5", "false-positive rates of the by-length detection: "
                                                              "exact p <= f (default 1e-3,1e-5)")):
        p.add_argument(flag, default=default, metavar="LIST", help=what)
    p.add_argument("--attack-quality", action="store_true", help="also the perplexity of every attacked text")
    p.add_argument("--model", metavar="PATH", help="a local Hugging Face model folder or GGUF file (default: embedded SmolLM2)")
    p.add_argument("--threads", type=int, metavar="N", help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--detect-backend", choices=("inline", "local", "ray"), default="inline",
                   help="where detection runs: this process (default), every local core, or a Ray cluster")
    p.add_argument("--detect-workers", type=int, metavar="N", help="local processes or Ray actors for detection")
    p.add_argument("--ray-address", metavar="ADDRESS", help="Ray cluster for --detect-backend ray (default: "
                                                            "RAY_ADDRESS or a new local instance)")
    p.add_argument("--generate-backend", choices=("engine", "vllm"), default="engine",
                   help="who generates: our engine (default) or vLLM with the provmark plugin (.venv-vllm)")
    p.set_defaults(func=run_robustness)
    _register_security(commands)
    group.set_defaults(func=lambda args: _missing_command(group))


SECURITY_DESCRIPTION = """Attacks on the watermark's secrecy, each run by a client holding only what that attacker holds:

  oracle     a detect-token client learning unit colours from verdicts (evaluation.security)
  stealing   colours estimated from N watermarked tokens of the generation API (evaluation.stealing;
             --estimator: the paper's pair vote, selfhash anchors learned from the text, or the bound of
             a thief told every unit by the key)
  spoofing   the unwatermarked model steered by the stolen colours, scored by the real detector
  scrubbing  watermarked text edited with the stolen colours, against blind edits at the same rate
  public-half  a two-part key against a spoofer who holds its public half (evaluation.public_half;
             --eval-texts prompts, --tokens, --spoof-delta)

Results (cached, resumable) in OUT/results.json with a plot per attack; docs/security.md has the
measured tables."""


def _register_security(commands) -> None:
    p = commands.add_parser("security", help="attacks on the watermark's secrecy, before and after the defences",
                            description=SECURITY_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attack", default="oracle", metavar="NAME",
                   help="oracle (default; a detect-token client learning colours from verdicts), stealing, spoofing, "
                        "scrubbing (from watermarked text; evaluation.security_attacks), public-half (a two-part "
                        "key against its public half's spoofer), or all")
    p.add_argument("--units", type=int, default=40, help="target units per attack, half green (default 40)")
    p.add_argument("--max-pairs", type=int, default=64, help="paired-difference pairs per unit, at most (default 64)")
    p.add_argument("--prefix-tokens", type=int, default=200, help="tokens of each query text (default 200)")
    p.add_argument("--power-texts", type=int, default=100, help="watermarked texts per strength for the power check")
    p.add_argument("--budget", type=int, default=None, metavar="TOKENS",
                   help="daily detection budget the figures are held to (default: the service default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="eval-security", metavar="DIR", help="output folder (default eval-security)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    # the stealing, spoofing and scrubbing attacks (evaluation.security_attacks)
    p.add_argument("--steal-tokens", default="10000,30000,100000", metavar="LIST",
                   help="stolen watermarked tokens N to measure at (comma-separated; default 10000,30000,100000)")
    p.add_argument("--schemes", default="lefthash;default", metavar="LIST",
                   help="presets or kgw specs, separated by ';' (default: lefthash;default)")
    p.add_argument("--tokens", type=int, default=200, help="tokens per generated text (default 200)")
    p.add_argument("--eval-texts", type=int, default=40, help="held-out prompts and human texts (default 40)")
    p.add_argument("--rates", default="0.1,0.2,0.3,0.5", metavar="LIST",
                   help="edit rates of scrubbing and human-text spoofing (default 0.1,0.2,0.3,0.5)")
    p.add_argument("--spoof-delta", type=float, default=4.0, help="bias the spoofer adds to believed-green tokens")
    p.add_argument("--estimator", default="pairs", choices=("pairs", "learned-anchors", "known-units"),
                   help="the thief's colour table: pairs (default: one vote per (context token, token)), "
                        "learned-anchors (selfhash: learns which context token anchors from the same text), or "
                        "known-units (told each unit by the key: an upper bound, not an attack)")
    p.add_argument("--threads", type=int, metavar="N", help="torch CPU threads (default: torch's choice)")
    p.set_defaults(func=run_security)


def run_security(args) -> int:
    from evaluation import security, security_cli  # noqa: PLC0415 (transformers loads for `eval security` only)

    try:
        oracle, stolen = security_cli.wanted_attacks(args.attack)
    except ValueError as exc:
        raise CLIError(f"--attack: {exc}") from None
    if args.threads is not None and args.threads < 1:
        raise CLIError(f"--threads: expected a positive integer, got {args.threads}")
    # every attack's settings are checked before any of them runs (an hour in, a typo would cost the rest)
    try:
        public_half = security_cli.public_half_config(args) if security_cli.wants_public_half(args.attack) else None
    except ValueError as exc:
        raise CLIError(f"--{str(exc).replace('_', '-')}") from None
    try:
        config = security.SecurityConfig(units=args.units, max_pairs=args.max_pairs, prefix_tokens=args.prefix_tokens,
                                         power_texts=args.power_texts, seed=args.seed,
                                         daily_budget=DEFAULT_DAILY_TOKENS if args.budget is None else args.budget)
    except ValueError as exc:
        raise CLIError("--" + str(exc).replace("_", "-")) from None
    attack_config = None
    if stolen:
        try:
            attack_config = security_cli.stealing_config(args, stolen)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    if public_half is not None:
        security_cli.run_public_half(args, public_half)
        if not oracle and not stolen:
            return 0
    if attack_config is not None:
        return security_cli.run_stealing_attacks(args, attack_config, oracle_config=config if oracle else None)
    results = security.run_security(config, args.out, progress=not args.no_progress)
    print(json.dumps(results["summary"], indent=1))
    print(f"results: {args.out}/results.json; plots: {', '.join(results.get('plots', []))}")
    return 0


def _missing_command(parser) -> int:
    parser.print_help()
    return 2


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _numbers(flag: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in _names(text))
    except ValueError:
        raise CLIError(f"{flag}: expected comma-separated numbers, got {text!r}") from None


def _integers(flag: str, text: str) -> tuple[int, ...]:
    values = _numbers(flag, text)
    if any(v != int(v) for v in values):
        raise CLIError(f"{flag}: expected comma-separated integers, got {text!r}")
    return tuple(int(v) for v in values)


def parse_schemes(values: list[str] | None) -> tuple[str, ...]:
    """Flag values -> scheme names and spec strings (specs hold commas, so they are split on ';')."""
    out = []
    for value in values or ["default"]:
        for piece in value.split(";"):
            piece = piece.strip()
            if not piece:
                continue
            out += [piece] if ":" in piece else _names(piece)
    return tuple(out)


def _attacks(text: str, every: tuple[str, ...], fast: tuple[str, ...]) -> tuple[str, ...]:
    if text.strip().lower() == "all":
        return every
    if text.strip().lower() == "fast":
        return fast
    return tuple(_names(text))


def run_robustness(args) -> int:
    from evaluation import attacks, harness, runner  # noqa: PLC0415 (transformers loads for `eval robustness` only)

    try:
        config = harness.EvalConfig(n=args.n, tokens=args.tokens, schemes=parse_schemes(args.schemes),
                                    attacks=_attacks(args.attacks, attacks.ATTACK_NAMES, attacks.FAST_ATTACKS),
                                    rates=_numbers("--rates", args.rates), seed=args.seed,
                                    temperature=args.temperature, null_keys=args.null_keys,
                                    deltas=_numbers("--deltas", args.deltas), max_num_seqs=args.max_num_seqs,
                                    attack_quality=args.attack_quality,
                                    lengths=_integers("--lengths", args.lengths),
                                    exact_fprs=_numbers("--exact-fprs", args.exact_fprs))
    except ValueError as exc:
        raise CLIError(str(exc).replace("max_num_seqs", "--max-num-seqs").replace("null_keys", "--null-keys")
                       .replace("exact_fprs", "--exact-fprs").replace("lengths", "--lengths")) from None
    if args.threads is not None:
        if args.threads < 1:
            raise CLIError(f"--threads: expected a positive integer, got {args.threads}")
        torch.set_num_threads(args.threads)
    loaded, keyring = _load(args)
    if args.detect_workers is not None and args.detect_workers < 1:
        raise CLIError(f"--detect-workers: expected a positive integer, got {args.detect_workers}")
    setup = runner.RunSetup(loaded=loaded, keyring=keyring, key_id=args.key, progress=not args.no_progress,
                            detect_backend=args.detect_backend, detect_workers=args.detect_workers,
                            ray_address=args.ray_address, generate_backend=args.generate_backend,
                            vllm_model=args.model)
    results = runner.run_evaluation(config, args.out, setup)
    print(json.dumps(headline(results), indent=1))
    print(f"results: {args.out}/results.json; plots: {', '.join(results.get('plots', []))}")
    return 0


def _load(args):
    keyring = Keyring()
    try:
        if args.key is not None and not any(k.key_id == args.key and k.usable_for_generation for k in keyring.list()):
            raise CLIError(f"--key: {args.key!r} is not a key of this keyring that can watermark")
        loaded = load_model(args.model)
    except KeyringError as exc:
        raise CLIError(str(exc)) from None
    except (ModelAssetError, OSError, ValueError) as exc:
        raise CLIError(f"cannot load the model: {exc}") from None
    return loaded, keyring


def headline(results: dict) -> dict:
    """Per scheme: clean detection, quality, and the weakest attack at the largest rate."""
    out = {}
    for scheme in results["schemes"]:
        cells = scheme["results"]
        clean = next((c for c in cells if c["rate"] == 0), None)
        top = max(c["rate"] for c in cells)
        worst = min((c for c in cells if c["rate"] == top), key=lambda c: c["tpr_default"])
        out[scheme["label"]] = {
            "tpr_default_no_edit": clean["tpr_default"] if clean else None,
            "median_z_no_edit": clean["median_z"] if clean else None,
            "perplexity_watermarked": scheme["quality"]["watermarked"]["perplexity_median"],
            "perplexity_unwatermarked": scheme["quality"]["unwatermarked"]["perplexity_median"],
            f"weakest_at_rate_{top:g}": {"attack": worst["attack"], "tpr_default": worst["tpr_default"]},
            "human_max_z": scheme["negatives"]["human"]["max_z"],
        }
    return out
