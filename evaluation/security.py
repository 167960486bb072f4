"""``provmark eval security --attack oracle``: the detector-oracle attacks before and after the defences.

Runs ``evaluation.oracle_attack`` against a real in-process detector with a fresh key in a temporary
keyring, writes ``OUT/results.json`` section by section (a second run with the same settings resumes:
finished sections are kept), and a plot of the paired-difference attack's accuracy against queries.

What it reports (docs/security.md holds a measured table):
* per attack and mode: queries per unit, balanced accuracy, refused queries;
* the best attack on the defended view: queries and budget tokens per unit at >= ``TARGET_ACCURACY``,
  units learnable per day under the budget, and whether learning 1 % of a 200-token text's units
  needs more than one token's daily budget (the target: one token's budget must not buy it);
* detection power of the detect-scope view on watermarked text at T = 200 (exact verdict vs shown).
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from db import budget
from detector.service import Detector
from evaluation import oracle_attack as oracle
from watermark.config import WatermarkSpec
from watermark.keys import Keyring
from watermark.vocab import load_vocabulary

TARGET_ACCURACY = 0.9  # balanced accuracy at which a unit counts as learned
OLD_RATE_PER_DAY = 600 * 60 * 24 * 2  # the old limit: 600/min per token per worker, `make serve` runs 2 workers
TEXT_UNITS = 200  # "1 % of the units a 200-token text uses"
POWER_FRACTIONS = (0.40, 0.45, 0.50, 0.55)  # green fractions of the synthetic watermarked texts (z ~ 5 to 10 at T = 200)


@dataclass(slots=True)
class SecurityConfig:
    units: int = 40  # target units per attack (half green)
    max_pairs: int = 64  # paired-difference queries per unit, at most (x2 texts each)
    prefix_tokens: int = 200
    power_texts: int = 100  # watermarked texts per green fraction for the power measurement
    daily_budget: int = budget.DEFAULT_DAILY_TOKENS
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("units", "max_pairs", "prefix_tokens", "power_texts", "daily_budget"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{name}: expected an integer >= 2, got {value!r}")


def run_security(config: SecurityConfig, out_dir: str | Path, progress: bool = True) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    results = _resumable(path, config)
    vocab = load_vocabulary()
    with tempfile.TemporaryDirectory(prefix="provmark-oracle-") as home:
        # a throw-away key from a fixed secret: the run is reproducible and touches no real keyring
        ring = Keyring(Path(home), master_key=bytes(32))
        ring.create("k-oracle", secret=random.Random(config.seed).randbytes(32))
        targets = {"before": oracle.Target(Detector(vocab=vocab, keyring=ring, bind_keys=False), defended=False),
                   "after": oracle.Target(Detector(vocab=vocab, keyring=ring), defended=True)}
        rng = random.Random(config.seed)
        words = oracle.word_tokens(vocab)
        units = oracle.make_units(targets["after"], words, config.units, rng)
        mark = targets["after"].detector.watermarks(_default_spec())[0]
        prefixes = oracle.watermarked_sequence(mark, words, 20 * config.prefix_tokens, 0.55, rng)
        for mode, target in targets.items():
            section = results["attacks"].setdefault(mode, {})
            for name, run in (("one_position", lambda t: oracle.one_position(t, units)),
                              ("spec_switch", lambda t: oracle.spec_switch(t, units)),
                              ("gamma_step", lambda t: oracle.gamma_step(t, units, _default_spec()))):
                if name not in section:
                    section[name] = _counted(target, run)
                    _write(path, results)
            if "paired_difference" not in section:
                pairs = 1 if mode == "before" else config.max_pairs  # exact z: one pair is enough
                bar = tqdm(total=len(units), desc=f"paired difference ({mode})", disable=not progress)
                section["paired_difference"] = _counted(target, lambda t: oracle.paired_difference(
                    t, units, prefixes, config.prefix_tokens, pairs, random.Random(config.seed + 1), bar))
                bar.close()
                _write(path, results)
        if "power" not in results:
            results["power"] = _power(targets["after"].detector, mark, words, config, progress)
            _write(path, results)
    results["summary"] = summarise(results, config)
    _write(path, results)
    results["plots"] = _plot(results, out)
    _write(path, results)
    return results


def _default_spec():

    return WatermarkSpec.default()


def _counted(target: oracle.Target, run) -> dict:
    before_q, before_r = target.queries, target.refused
    result = run(target)
    result["queries"] = target.queries - before_q
    result["refused"] = target.refused - before_r
    return result


def _power(detector, mark, words: list[int], config: SecurityConfig, progress: bool) -> list[dict]:
    """Watermarked texts of T = prefix_tokens at several strengths: exact verdict vs the detect-scope view."""
    rng = random.Random(config.seed + 2)
    rows = []
    for fraction in tqdm(POWER_FRACTIONS, desc="power", disable=not progress):
        exact = shown = 0
        zs = []
        for _ in range(config.power_texts):
            ids = oracle.watermarked_sequence(mark, words, config.prefix_tokens + mark.context_width, fraction, rng)
            verdict = detector.detect(detector.vocab.tokenizer.decode(ids))
            zs.append(verdict.z_score)
            exact += verdict.verdict == "watermarked"
            shown += verdict.disclose("detect")["verdict"] == "watermarked"
        rows.append({"green_fraction": fraction, "median_z": float(np.median(zs)),
                     "tpr_exact": exact / config.power_texts, "tpr_detect_view": shown / config.power_texts})
    return rows


def summarise(results: dict, config: SecurityConfig) -> dict:
    """Queries and budget tokens per learned unit; what a day of budget buys; the target above."""
    after = results["attacks"]["after"]["paired_difference"]["accuracy_by_pairs"]
    pairs = next((int(n) for n, acc in sorted(after.items(), key=lambda kv: int(kv[0])) if acc >= TARGET_ACCURACY), None)
    charge = budget.charge_for(config.prefix_tokens + 5)
    tokens_per_unit = None if pairs is None else 2 * pairs * charge
    lower_bound = pairs is None  # the attack did not reach the accuracy within max_pairs: a lower bound
    if lower_bound:
        tokens_per_unit = 2 * 2 * config.max_pairs * charge  # at least the next doubling
    units_needed = max(1, round(0.01 * TEXT_UNITS))
    before_best = max(results["attacks"]["before"][name]["balanced_accuracy"]
                      for name in ("one_position", "spec_switch", "gamma_step"))
    return {
        "before": {"queries_per_unit": 1, "balanced_accuracy": before_best,
                   "units_per_day_under_old_rate_limit": OLD_RATE_PER_DAY},
        "after": {"paired_difference_pairs_for_accuracy": pairs, "target_accuracy": TARGET_ACCURACY,
                  "queries_per_unit": None if pairs is None else 2 * pairs, "lower_bound": lower_bound,
                  "budget_tokens_per_unit": tokens_per_unit, "daily_budget_tokens": config.daily_budget,
                  "units_per_day_under_budget": config.daily_budget / tokens_per_unit,
                  "budget_tokens_to_learn_1pct_of_200_token_text": units_needed * tokens_per_unit,
                  "target_met": units_needed * tokens_per_unit > config.daily_budget},
    }


def _resumable(path: Path, config: SecurityConfig) -> dict:
    settings = asdict(config)
    if path.exists():
        found = json.loads(path.read_text())
        if found.get("config") == settings:
            return found
    return {"config": settings, "attacks": {}}


def _write(path: Path, results: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str))
    tmp.replace(path)


def _plot(results: dict, out: Path) -> list[str]:
    import matplotlib  # noqa: PLC0415 (matplotlib, heavy: loaded only to draw the plots)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (after choosing the Agg backend)

    curve = {int(n): acc for n, acc in results["attacks"]["after"]["paired_difference"]["accuracy_by_pairs"].items()}
    xs = sorted(curve)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([2 * x for x in xs], [curve[x] for x in xs], marker="o", label="after: coarse, dithered view")
    ax.axhline(results["attacks"]["before"]["one_position"]["balanced_accuracy"], color="red", linestyle="--",
               label="before: one query per unit")
    ax.axhline(TARGET_ACCURACY, color="grey", linestyle=":", label=f"learned ({TARGET_ACCURACY:g})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("detect queries per unit")
    ax.set_ylabel("balanced accuracy of its colour")
    ax.set_ylim(0.4, 1.02)
    ax.legend(fontsize=7)
    fig.tight_layout()
    name = "oracle_accuracy.png"
    fig.savefig(out / name, dpi=120)
    plt.close(fig)
    return [name]
