"""Clean TPR of the sampling watermarks' defaults at T tokens and FPR 1e-5, on the embedded model.

    python benchmarks/sampling_tpr.py [--prompts 20] [--tokens 200] [--out FILE]

Each default spec (gumbel:h=4, synthid:h=4) generates one chat answer per prompt at temperature 1
(``ignore_eos``: exactly T tokens), with one fixed random key per run; the text's token ids are scored
whole by ``detector.scoring_sampling.score_text`` (dedup, exact p). A text is detected when p < 1e-5.
Reported: TPR with its Clopper-Pearson 95 % interval, and the p-value quantiles.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

import numpy as np
from scipy.stats import beta

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, write_json  # noqa: E402
from detector.scoring_sampling import score_text  # noqa: E402
from generation.engine import Engine  # noqa: E402
from generation.sample.params import SamplingParams  # noqa: E402
from watermark.scheme import make_watermark  # noqa: E402

SPECS = ("gumbel:h=4", "synthid:h=4")
FPR = 1e-5
TOPICS = ["lighthouses", "a storm at sea", "how bread rises", "the moon's phases", "bees", "the printing press",
          "glaciers", "chess openings", "volcanoes", "the water cycle", "trains in India", "coral reefs",
          "the violin", "desert plants", "the Roman roads", "owls", "paper making", "tides", "the first bicycles",
          "tea"]


def clopper_pearson(hits: int, n: int, level: float = 0.95) -> tuple[float, float]:
    alpha = 1 - level
    low = 0.0 if hits == 0 else float(beta.ppf(alpha / 2, hits, n - hits + 1))
    high = 1.0 if hits == n else float(beta.ppf(1 - alpha / 2, hits + 1, n - hits))
    return low, high


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    engine = Engine(max_num_seqs=16, max_model_len=1024)
    prompts = [engine.apply_chat_template([{"role": "user", "content": f"Write a short essay about {t}."}])
               for t in (TOPICS * (args.prompts // len(TOPICS) + 1))[:args.prompts]]
    results = {}
    for spec in SPECS:
        mark = make_watermark(spec, secrets.token_bytes(32), engine.vocab_size, "bench")
        params = [SamplingParams(max_new_tokens=args.tokens, ignore_eos=True, seed=i) for i in range(len(prompts))]
        outs = engine.generate(prompts, params, [mark] * len(prompts), use_tqdm=False)
        p_values = np.array([score_text(mark, o.token_ids).p_value for o in outs])
        hits = int((p_values < FPR).sum())
        low, high = clopper_pearson(hits, len(outs))
        results[spec] = {"tpr": hits / len(outs), "tpr_95ci": [round(low, 3), round(high, 3)], "texts": len(outs),
                         "p_value_quantiles": {q: float(np.quantile(p_values, q)) for q in (0.0, 0.5, 0.9, 1.0)}}
    write_json("sampling_tpr", {"machine": machine(), "tokens": args.tokens, "fpr": FPR, "temperature": 1.0,
                                "results": results}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
