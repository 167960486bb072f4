"""Clean detectability of the sampling watermarks' defaults on the embedded model, beside KGW's default.

    python benchmarks/sampling_detectability.py [--prompts 32] [--tokens 200] [--batch 16] [--out FILE]

Chat prompts ("Write about <topic>."), temperature 1, no truncation, EOS suppressed so every text has
``--tokens`` new tokens; a plain batched sampling loop with a KV cache (the engine does not run these
stages yet): gumbel / synthid choose the token on rows whose context is fresh (generation-time dedup),
KGW biases the logits. Texts are decoded and re-tokenized, then scored: TPR at FPR 1e-3 and 1e-5 (p
below the rate), median p, and the first length (in tokens) at which p < 1e-5.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, parse_args, write_json  # noqa: E402
from detector.scoring import score_positions  # noqa: E402
from detector.scoring_sampling import score_text  # noqa: E402
from generation.models import load_model  # noqa: E402
from watermark.gumbel import GumbelWatermark  # noqa: E402
from watermark.sampling_common import SeenContexts  # noqa: E402
from watermark.scheme import Watermark  # noqa: E402
from watermark.stats import p_value_binomial  # noqa: E402
from watermark.synthid import SynthIDWatermark  # noqa: E402

SECRET = hashlib.sha256(b"provmark-bench/detectability").digest()
TOPICS = ["lighthouses", "bread baking", "the moon", "rivers", "chess", "volcanoes", "bees", "trains", "rain",
          "libraries", "winter", "coffee", "bridges", "owls", "the ocean", "music", "gardens", "maps", "clocks",
          "mountains", "bicycles", "cats", "deserts", "stars", "forests", "islands", "kites", "glass", "salt",
          "snow", "markets", "letters"]


def generate(loaded, prompts: list[str], tokens: int, stage, seed: int) -> list[list[int]]:
    tok = loaded.vocab.tokenizer
    tok.padding_side = "left"
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in prompts]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    generator = torch.Generator().manual_seed(seed)
    histories = [row[mask.bool()].tolist() for row, mask in zip(enc.input_ids, enc.attention_mask)]
    seen = [SeenContexts() for _ in prompts]
    new: list[list[int]] = [[] for _ in prompts]
    attention, step_input, past = enc.attention_mask, enc.input_ids, None
    positions = (attention.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        for _ in range(tokens):
            out = loaded.model(step_input, attention_mask=attention, position_ids=positions, past_key_values=past,
                               use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1, :].float()
            if loaded.vocab.eos_token_id is not None:
                logits[:, loaded.vocab.eos_token_id] = float("-inf")
            chosen = stage(logits, histories, seen, generator)
            for row, token in enumerate(chosen):
                histories[row].append(token)
                new[row].append(token)
            step_input = torch.tensor(chosen).unsqueeze(1)
            attention = torch.cat([attention, torch.ones(len(prompts), 1, dtype=attention.dtype)], dim=1)
            positions = positions[:, -1:] + 1
    return new


def sampled(logits, generator) -> list[int]:
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)[:, 0].tolist()


def race_stage(mark):
    def stage(logits, histories, seen, generator):
        out = sampled(logits, generator)
        for row, history in enumerate(histories):
            context = tuple(history[-mark.context_width:])
            if seen[row].first_time(context):
                if isinstance(mark, GumbelWatermark):
                    out[row] = int(mark.choose(logits[row:row + 1], torch.tensor([context]))[0])
                else:
                    tour = mark.tournament_logits(logits[row:row + 1], torch.tensor([context]))
                    out[row] = int(torch.multinomial(torch.softmax(tour[0], 0), 1, generator=generator))
        return out
    return stage


def kgw_stage(mark):
    def stage(logits, histories, seen, generator):
        return sampled(mark.bias(logits.clone(), histories), generator)
    return stage


def p_values_by_length(name, mark, ids: torch.Tensor, lengths) -> list[float]:
    if name == "kgw":
        out = []
        for n in lengths:
            flags, prev = score_positions(mark, ids[:n])
            counted = prev < 0
            out.append(p_value_binomial(int((flags & counted).sum()), int(counted.sum()), mark.gamma))
        return out
    return [score_text(mark, ids[:n]).p_value for n in lengths]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, threads=2, prompts=32, tokens=200, batch=16)
    loaded = load_model()
    V = loaded.vocab.vocab_size
    schemes = {"gumbel": GumbelWatermark("gumbel:h=4", SECRET, V),
               "synthid": SynthIDWatermark("synthid:h=4,layers=30,top_k=40", SECRET, V),
               "kgw": Watermark("kgw:scheme=selfhash,h=4", SECRET, V)}
    prompts = [f"Write about {TOPICS[i % len(TOPICS)]}." for i in range(args.prompts)]
    lengths = list(range(25, args.tokens + 1, 25))
    results = {}
    for name, mark in schemes.items():
        stage = kgw_stage(mark) if name == "kgw" else race_stage(mark)
        curves = []
        for start in range(0, len(prompts), args.batch):
            for ids in generate(loaded, prompts[start:start + args.batch], args.tokens, stage, seed=start):
                text = loaded.vocab.tokenizer.decode(ids, skip_special_tokens=True)
                retok = torch.tensor(loaded.vocab.tokenizer(text, add_special_tokens=False).input_ids)
                curves.append(p_values_by_length(name, mark, retok, lengths))
        final = [c[-1] for c in curves]
        first = [next((n for n, p in zip(lengths, c) if p < 1e-5), None) for c in curves]
        results[name] = {
            "spec": mark.spec.format(),
            "texts": len(curves),
            "tpr_at_fpr_1e-3": sum(p < 1e-3 for p in final) / len(final),
            "tpr_at_fpr_1e-5": sum(p < 1e-5 for p in final) / len(final),
            "median_p": statistics.median(final),
            "median_tokens_to_p_1e-5": statistics.median([n if n is not None else float("inf") for n in first]),
        }
        print(name, results[name], flush=True)
    write_json("sampling_detectability", {
        "benchmark": "sampling_detectability",
        "command": "python benchmarks/sampling_detectability.py "
                   + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(), "tokens": args.tokens, "temperature": 1.0, "results": results}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
