"""The spoof check's false-flag rate on the service's own output, as the service lives it.

    python -m evaluation.own_output_null [--texts 2000] [--tokens 200] [--spec SPEC] [--out DIR]

``spoof_suspected`` (``detector.spoof_check``) flags a positive verdict whose spoof z is beyond the 1e-3
tail of a *normal fit* to the key's own outputs. Whether that tail holds is a question about real output
in the thousands, which a toy world cannot answer. This run replays the service's path with the embedded
model: one fixed key bound to ``spec`` (a throw-away keyring, fixed secret), ``texts`` watermarked
outputs of ``tokens`` tokens on the evaluation's news prompts (temperature 1, seeded rounds over the
prompts), each remembered in order exactly as the generation service does (``output_null_z`` against the
counts before it, then ``OutputMemory.record``, on a real SQLite store), then every output past the
warm-up checked as a verdict would check it once the service had written it (``verdict_spoof_check``,
the memory as it stood right after that output: its own units counted, the null of the outputs before
it). Genuine output should be flagged at about the nominal rate at every alpha; the prequential order
means no output is judged against a memory that already holds later ones.

Results: ``OUT/results.json`` (flag rates at 1e-3, 1e-2, 5e-2 under the normal fit and the empirical
tail, with binomial upper bounds; the null's mean and sd as the memory grows) and ``OUT/own-output-null.png``
(the genuine outputs' p-values against the uniform). Generations are cached in ``OUT/generations.jsonl``,
so a rerun resumes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from scipy import stats
from tqdm import tqdm

from db.output_memory import WARMUP, MemoryMirror, OutputMemory
from db.store import Store
from detector import common_units
from detector.spoof_check import MIN_NULL, output_null_z, scored_units, verdict_spoof_check
from evaluation.corpus import prompt_documents
from evaluation.harness import PROMPT_TEMPLATE
from generation.models import load_model
from generation.sample.params import SamplingParams
from watermark.config import WatermarkSpec
from watermark.keys import Keyring
from watermark.scheme import generation_watermark, make_watermark
from watermark.schemes import FAMILIES, family_of
from watermark.specs import parse_spec
from watermark.vocab import load_vocabulary

ALPHAS = (1e-3, 1e-2, 5e-2)
PROMPTS = 250  # the evaluation corpus's first prompts (evaluation.security_attacks.TRAIN_PROMPTS)


def generate(out: Path, texts: int, tokens: int, spec, secret: bytes, seed: int, progress: bool = True) -> list[list[int]]:
    """``texts`` watermarked outputs (token ids) in generation order, cached in OUT/generations.jsonl."""
    # the engine and the runner load transformers: the replay, and the arguments' checks, run without them
    from evaluation.runner import chat_prompt_ids  # noqa: PLC0415 (transformers loads for generating only)
    from generation.engine import Engine  # noqa: PLC0415 (transformers loads for generating only)

    cache = out / "generations.jsonl"
    done = [json.loads(line)["token_ids"] for line in cache.read_text().splitlines()] if cache.exists() else []
    if len(done) >= texts:
        return done[:texts]
    loaded = load_model()
    documents = prompt_documents(PROMPTS)
    prompts = [chat_prompt_ids(loaded.vocab.tokenizer, PROMPT_TEMPLATE.format(sentence=d.first_sentence))
               for d in documents]
    with tempfile.TemporaryDirectory(prefix="provmark-own-null-") as home:
        ring = Keyring(Path(home), master_key=bytes(32))
        info = ring.create("own-null", secret=secret, spec=spec)
        mark = generation_watermark(spec, loaded.vocab.vocab_size, info.key_id, ring)
        engine = Engine(loaded, max_num_seqs=48, max_model_len=max(map(len, prompts)) + tokens + 8)
        bar = tqdm(total=texts, initial=len(done), desc="watermarked outputs", unit="text", disable=not progress)
        with cache.open("a") as sink:
            while len(done) < texts:
                batch = range(len(done), min(texts, len(done) + 48))
                params = [SamplingParams(max_new_tokens=tokens, min_new_tokens=tokens, temperature=1.0,
                                         seed=seed * 1_000_003 + i) for i in batch]
                outputs = engine.generate([prompts[i % len(prompts)] for i in batch], params,
                                          watermarks=[mark] * len(params), use_tqdm=False)
                for out_ in outputs:
                    done.append(list(out_.token_ids))
                    sink.write(json.dumps({"token_ids": done[-1]}) + "\n")
                sink.flush()
                bar.update(len(outputs))
        bar.close()
    return done


def replay(outputs: list[list[int]], spec, secret: bytes, vocab, progress: bool = True) -> list[dict]:
    """Each output remembered in order as the generation service does, then checked as a verdict would be
    right after: one dict per output past the warm-up with the null size and the check's p-values."""
    mark = make_watermark(spec, secret, vocab.vocab_size, "own-null")
    common = common_units.for_spec(mark.spec, vocab)
    checks = []
    with tempfile.TemporaryDirectory(prefix="provmark-own-null-db-") as home:
        store = Store(f"sqlite:///{home}/memory.db")
        store.upgrade()
        memory = OutputMemory(store)
        mirror = MemoryMirror(memory, sync_seconds=0.0)  # the memory as it stands after each output
        for index, ids in enumerate(tqdm(outputs, desc="remember and check", unit="text", disable=not progress)):
            tensor = torch.as_tensor(ids, dtype=torch.int64)
            z, identities = output_null_z(mark, tensor, common, memory)
            memory.record(mark.key_id, identities, z)
            if index < WARMUP + MIN_NULL:
                continue
            found = verdict_spoof_check(mark, scored_units(mark, tensor, common), mirror.view(mark.key_id))
            if found is not None and found.get("p_value") is not None:
                checks.append({"index": index, **found})
        store.close()
    return checks


def summarise(checks: list[dict]) -> dict:
    n = len(checks)
    out = {"checked": n}
    for alpha in ALPHAS:
        for field in ("p_value", "p_value_empirical"):
            flagged = sum(c[field] <= alpha for c in checks)
            upper = float(stats.beta.ppf(0.975, flagged + 1, n - flagged)) if n > flagged else 1.0
            out[f"{field}_flagged_at_{alpha:g}"] = {"flagged": int(flagged), "rate": flagged / n if n else None,
                                                     "upper_95": upper, "expected": alpha * n}
    z = np.array([c["z"] for c in checks])
    out["z_mean"], out["z_sd"] = float(z.mean()), float(z.std(ddof=1))
    out["ks_uniform_p_value"] = float(stats.kstest([c["p_value"] for c in checks], "uniform").pvalue)
    return out


def plot(checks: list[dict], path: Path) -> None:
    import matplotlib  # noqa: PLC0415 (matplotlib, heavy: loaded only to draw the plot)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (after choosing the Agg backend)

    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    n = len(checks)
    expected = (np.arange(1, n + 1) - 0.5) / n
    for field, label in (("p_value", "normal fit (spoof_suspected)"), ("p_value_empirical", "empirical tail")):
        ax.loglog(expected, np.sort([c[field] for c in checks]), ".", ms=3, label=label)
    ax.loglog([1 / n, 1], [1 / n, 1], "k--", lw=0.8, label="uniform")
    ax.axhline(1e-3, color="grey", lw=0.6)
    ax.set_xlabel("expected p (uniform)")
    ax.set_ylabel("p of genuine outputs")
    ax.set_title(f"spoof check on {n} genuine outputs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--spec", default=None, help="the key's spec (default: the default spec)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default="eval-own-null")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    try:
        spec = parse_spec(args.spec) if args.spec else WatermarkSpec.default()
        if args.texts < 300 or args.tokens < 50:
            raise ValueError("--texts must be >= 300 and --tokens >= 50 (the null needs 140 outputs first)")
        if not family_of(spec).spoof_judged or not spec.needs_key:
            raise ValueError(f"--spec: the check judges keys of {', '.join(judged_families())}, not {spec.format()!r}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    secret = random.Random(f"{args.seed}|own-output-null|{spec.format()}").randbytes(32)
    outputs = generate(out, args.texts, args.tokens, spec, secret, args.seed, not args.no_progress)
    checks = replay(outputs, spec, secret, load_vocabulary(), not args.no_progress)
    results = {"spec": spec.format(), "texts": len(outputs), "tokens": args.tokens, "seed": args.seed,
               "summary": summarise(checks), "checks": checks}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    plot(checks, out / "own-output-null.png")
    print(json.dumps(results["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def judged_families() -> list[str]:
    """The families whose spoof check has measured power (``SchemeFamily.spoof_judged``)."""
    return [family.name for family in FAMILIES if family.spoof_judged]
