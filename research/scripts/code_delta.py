"""What a kgw spec's code_delta buys and costs: on code-generation and prose prompts, the z of the first 200 tokens as
the detector scores them (common units left out, dedup), the share at or above a z threshold, and the mean negative
log-likelihood of those tokens under the unwatermarked model (a perplexity proxy), for several biases
(docs/schemes.md, "Code").

    python research/scripts/code_delta.py [--n 40] [--settings "2.0;2.0/3.0;2.0/3.5;3.0"] [--kinds code,prose]
        [--out benchmarks/results/code_delta.json]

A setting is ``delta`` or ``delta/code_delta``. Prompts are promise_power.py's (the same tasks, seeds and chat
template); the key is one fresh key (a temporary PROVMARK_HOME), every setting under the same key, temperature 1,
260 new tokens. ``z_at`` thresholds: 4.265 is FPR 1e-5; 5.115 adds the bounded code margin (detector.promise).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from promise_power import code_tasks, prose_tasks  # noqa: E402

from detector.common_units import THRESHOLDS, for_spec, threshold_for_length  # noqa: E402
from detector.normalize import normalize as normalize_text  # noqa: E402
from detector.scoring import counted_positions, score_positions  # noqa: E402
from detector.tokenizing import tokenize  # noqa: E402
from evaluation.generations import request_seed  # noqa: E402
from generation.engine import Engine  # noqa: E402
from generation.models import load_model  # noqa: E402
from generation.sample.sampler import SamplingParams  # noqa: E402
from watermark.keys import Keyring  # noqa: E402
from watermark.scheme import make_watermark  # noqa: E402
from watermark.specs import parse_spec  # noqa: E402
from watermark.vocab import load_vocabulary  # noqa: E402

LENGTH, NEW_TOKENS = 200, 260
THRESHOLD_Z = (4.265, 5.115)


def spec_text(setting: str) -> str:
    delta, _, code = setting.partition("/")
    return f"kgw:scheme=selfhash,h=4,gamma=0.25,delta={delta}" + (f",code_delta={code}" if code else "")


def z_of(mark, common, vocab, text: str) -> float:
    ids, _ = tokenize(vocab, normalize_text(text, True).text, with_offsets=False)
    ids = torch.as_tensor(ids[:LENGTH], dtype=torch.int64)
    flags, prev = score_positions(mark, ids, None, True)
    limit = threshold_for_length(THRESHOLDS[mark.spec.scheme], int(ids.shape[0]), common.window_tokens)
    kept = counted_positions(prev) & (common.frequency_of(mark.unit_identities(ids)) < limit)
    n, g = int(kept.sum()), int(flags[kept].sum())
    return (g - mark.gamma * n) / np.sqrt(max(n, 1) * mark.gamma * (1 - mark.gamma))


def mean_nll(model, prompt: list[int], tokens: list[int]) -> float:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return float(torch.nn.functional.cross_entropy(logits, torch.tensor(tokens)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--settings", default="2.0;2.0/3.0;2.0/3.5;3.0")
    parser.add_argument("--kinds", default="code,prose")
    parser.add_argument("--out", default="benchmarks/results/code_delta.json")
    args = parser.parse_args(argv)
    os.environ["PROVMARK_HOME"] = tempfile.mkdtemp(prefix="provmark-code-delta-")
    vocab = load_vocabulary()
    keyring = Keyring()
    key = keyring.ensure_active()
    loaded = load_model(None)
    engine = Engine(loaded, max_num_seqs=20)
    report: dict = {"n": args.n, "length": LENGTH, "rows": []}
    for kind in args.kinds.split(","):
        tasks = code_tasks(args.n) if kind == "code" else prose_tasks(args.n)
        prompts = [engine.apply_chat_template([{"role": "user", "content": t}]) for t in tasks]
        for setting in args.settings.split(";"):
            mark = make_watermark(parse_spec(spec_text(setting)), keyring.secret(key.key_id), vocab.vocab_size,
                                  key_id=key.key_id)
            common = for_spec(mark.spec, vocab)
            params = [SamplingParams(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, temperature=1.0,
                                     seed=request_seed(0, i)) for i in range(len(prompts))]
            outs = engine.generate(prompts, params, watermarks=[mark] * len(prompts))
            z = np.array([z_of(mark, common, vocab, o.text) for o in outs])
            nll = [mean_nll(loaded.model, p, list(o.token_ids)[:LENGTH]) for p, o in zip(prompts, outs)]
            row = {"kind": kind, "setting": setting, "spec": spec_text(setting), "median_z": float(np.median(z)),
                   **{f"share_z_at_least_{t}": float(np.mean(z >= t)) for t in THRESHOLD_Z},
                   "mean_nll": float(np.mean(nll))}
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
