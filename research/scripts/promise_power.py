"""What the promise costs in detection power: clean TPR at T tokens and FPR f, and tokens to detect, with the margins of
``detector.promise`` and without (today's verdicts), on the same watermarked generations of the embedded model
(docs/research/key-shift-collections.md).

    python research/scripts/promise_power.py [--n 40] [--tokens 260] [--length 200] [--fpr 1e-5] [--out DIR]

Prompts: ``--n`` prose prompts as ``provmark eval robustness`` draws them (``evaluation.corpus``: a news article's first
sentence in the evaluation's template) and ``--n`` code-generation prompts (CODE_TASKS in several languages), each
through the chat template; the default spec under a fresh key that ``keys create`` would make (screened and
calibrated, in a temporary ``PROVMARK_HOME``), temperature 1, exactly ``--tokens`` new tokens. Each generation is
scored as the detector scores it and as ``provmark eval`` scores its prefixes (``evaluation.prefix``): TPR at
``--length`` tokens is the share whose first ``--length`` tokens have p <= ``--fpr``; tokens to detect is the median
of the shortest prefix the detector calls watermarked (p <= 3.2e-5). "promise" is the bounded promise (the key as
``keys create`` makes it), "measured" the measured one (the key calibrated with ``--corpus`` on texts of both kinds;
its guard left out). Writes DIR/promise_power.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from scipy import special

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from detector import promise  # noqa: E402
from detector.calibrate import ensure_screened_active_key  # noqa: E402
from detector.normalize import normalize as normalize_text  # noqa: E402
from detector.service import Detector  # noqa: E402
from detector.tokenizing import tokenize  # noqa: E402
from evaluation.corpus import prompt_documents  # noqa: E402
from evaluation.generations import request_seed  # noqa: E402
from evaluation.harness import EvalConfig  # noqa: E402
from evaluation.metrics import tokens_to_detect  # noqa: E402
from evaluation.prefix import prefix_p_values  # noqa: E402
from generation.engine import Engine  # noqa: E402
from generation.models import load_model  # noqa: E402
from generation.sample.sampler import SamplingParams  # noqa: E402
from watermark.keys import Keyring  # noqa: E402
from watermark.scheme import generation_watermark  # noqa: E402
from watermark.specs import parse_spec  # noqa: E402
from watermark.stats import p_value_normal  # noqa: E402
from watermark.vocab import load_vocabulary  # noqa: E402

LANGUAGES = ("Python", "JavaScript", "C", "Go", "Rust", "Java", "Bash", "SQL")
TASKS = ("reverses a linked list", "parses a CSV file and sums the second column", "checks whether a string is a palindrome",
         "computes the n-th Fibonacci number with memoisation", "merges two sorted arrays",
         "counts the words in a text file", "implements binary search over a sorted list", "validates an e-mail address",
         "reads a JSON configuration file and prints its keys", "implements a simple stack with push and pop")
CODE_TEMPLATE = "Write a {language} program that {task}. Give the full code with comments."


def code_tasks(n: int) -> list[str]:
    return [CODE_TEMPLATE.format(language=LANGUAGES[i % len(LANGUAGES)], task=TASKS[(i // len(LANGUAGES) + i) % len(TASKS)])
            for i in range(n)]


def prose_tasks(n: int) -> list[str]:
    template = EvalConfig().prompt_template
    return [template.format(sentence=d.first_sentence) for d in prompt_documents(n)]


# a key calibrated on the deployment's texts of both kinds (``keys calibrate --corpus``): the measured promise's margins
MEASURED_BOTH = SimpleNamespace(domains={"yours": {"kinds": {"prose": {"n": 100}, "code": {"n": 100}}}})


def measure(detector, vocab, mark, texts: list[str], length: int, fpr: float, with_promise: str | None) -> dict:
    common = detector.common_units_for(mark.spec)
    calibration = MEASURED_BOTH if with_promise == "measured" else detector.calibrations_for([mark])[0]
    at_length, needed, kinds, z, z_head = [], [], [], [], []
    for text in texts:
        ids, _ = tokenize(vocab, normalize_text(text, True).text, with_offsets=False)
        ids = np.asarray(ids, dtype=np.int64)
        margins = promise.prefix_margins(vocab, ids, mark.spec.scheme, calibration) if with_promise else None
        p = prefix_p_values(mark, ids, common=common, margins=margins)
        at_length.append(p[min(length, p.shape[0] - 1)] <= fpr)
        head = prefix_p_values(mark, ids[:length], common=common)  # today's exact p of the first tokens alone
        z_head.append(float(-special.ndtri(max(head[-1], 1e-300))))
        needed.append(tokens_to_detect(p <= p_value_normal(4.0)))
        kinds.append(promise.text_kind(vocab, ids[:length]))
        z.append(detector.detect(text, keys=[mark.key_id]).z_score)
    found = [n for n in needed if n is not None]
    return {"texts": len(texts), f"tpr_at_{length}": float(np.mean(at_length)),
            "tokens_to_detect_median": float(np.median(found)) if found else None,
            "never_detected": len(needed) - len(found), "median_z": float(np.median(z)),
            "kinds": {k: kinds.count(k) for k in promise.KINDS},
            f"z_of_exact_p_at_{length}": sorted(round(v, 2) for v in z_head)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=260)
    parser.add_argument("--length", type=int, default=200)
    parser.add_argument("--fpr", type=float, default=1e-5)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--home", help="PROVMARK_HOME holding the key (kept, so saved generations can be re-scored; "
                                       "default: a new temporary one)")
    args = parser.parse_args(argv)
    home = args.home or tempfile.mkdtemp(prefix="provmark-promise-power-")
    os.environ["PROVMARK_HOME"] = home

    vocab = load_vocabulary()
    keyring = Keyring()
    info, _ = ensure_screened_active_key(keyring, vocab)
    mark = generation_watermark(parse_spec(None), vocab.vocab_size, key_id=info.key_id)
    engine = Engine(load_model(None), max_num_seqs=20)
    detector = Detector(vocab=vocab, keyring=keyring)
    report = {"key": info.key_id, "tokens": args.tokens, "length": args.length, "fpr": args.fpr}
    for label, tasks in (("prose", prose_tasks(args.n)), ("code", code_tasks(args.n))):
        prompts = [engine.apply_chat_template([{"role": "user", "content": t}]) for t in tasks]
        params = [SamplingParams(max_new_tokens=args.tokens, min_new_tokens=args.tokens, temperature=1.0,
                                 seed=request_seed(args.seed, i)) for i in range(len(prompts))]
        saved = Path(args.out) / f"promise_power_{label}.jsonl"
        if saved.exists():  # the same generations again (same key, prompts and seeds): re-measured, not re-generated
            texts = [json.loads(line)["text"] for line in saved.read_text().splitlines()]
        else:
            texts = [out.text for out in engine.generate(prompts, params, watermarks=[mark] * len(prompts),
                                                         use_tqdm=True)]
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        report[label] = {name: measure(detector, vocab, mark, texts, args.length, args.fpr, flag)
                         for name, flag in (("today", None), ("promise", "bounded"), ("measured", "measured"))}
        today, held = report[label]["today"], report[label]["promise"]
        if today["tokens_to_detect_median"] and held["tokens_to_detect_median"]:
            report[label]["tokens_to_detect_ratio"] = held["tokens_to_detect_median"] / today["tokens_to_detect_median"]
        print(label, json.dumps(report[label]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "promise_power.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
