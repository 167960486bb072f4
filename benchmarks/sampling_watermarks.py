"""Cost of the sampling watermarks' stages per decode step, and their detection throughput.

    python benchmarks/sampling_watermarks.py [--batch 16] [--repeats 20] [--texts 8] [--threads 2] [--out FILE]

Stage cost at batch B over the embedded model's vocabulary, in one run, against two peers:
  sample        softmax + multinomial (the plain sampler these stages replace or precede)
  kgw bias      our KGW bias (default spec) + sample: the engine's watermark today (2.4 % of a step)
  gumbel        the keyed race: B PRF calls, fmix64(mix64) over [B, V], Gumbel noise, argmax
  synthid       the 30-layer tournament over the top 40 candidates + sample (and over all of V)
  hf:synthid    transformers' SynthID processor (ours, bit-exact) + sample
Contexts are fresh every step (no PRF cache hits), as in generation.

Detection: token ids -> whole-text score (dedup, exact p) on 1,000-token texts of the Lee corpus, and
transformers' KGW WatermarkDetector end to end on the same texts (the peer of detector_throughput.py).
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, WatermarkDetector, WatermarkingConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, parse_args, time_call, write_json  # noqa: E402
from benchmarks.detector_throughput import corpus_texts  # noqa: E402
from detector.scoring_sampling import score_text  # noqa: E402
from watermark.gumbel import GumbelWatermark  # noqa: E402
from watermark.hf_synthid import HFSynthID  # noqa: E402
from watermark.scheme import Watermark  # noqa: E402
from watermark.synthid import SynthIDWatermark  # noqa: E402
from watermark.vllm_gumbel import VLLMGumbel  # noqa: E402
from watermark.vocab import encode, load_vocabulary  # noqa: E402

SECRET = hashlib.sha256(b"provmark-bench/sampling").digest()
HF_SPEC = "hf:synthid,keys=" + ":".join(str(k) for k in range(101, 131)) + ",ngram_len=5"


def stage_costs(vocab_size: int, batch: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, vocab_size, generator=gen)
    counter = iter(range(10**9))

    def contexts(width: int = 4) -> torch.Tensor:  # fresh every call: no cache hits
        step = next(counter)
        return torch.arange(batch * width).reshape(batch, width) + step * batch * width

    def sample(x: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(torch.softmax(x, dim=-1), 1, generator=gen)

    kgw = Watermark("kgw:scheme=selfhash,h=4", SECRET, vocab_size)
    gumbel = GumbelWatermark("gumbel:h=4", SECRET, vocab_size)
    synthid = SynthIDWatermark("synthid:h=4,layers=30", SECRET, vocab_size)
    synthid_full = SynthIDWatermark("synthid:h=4,layers=30,top_k=0", SECRET, vocab_size)
    hf = HFSynthID(HF_SPEC, vocab_size)
    cases = {
        "sample": lambda: sample(logits),
        "kgw_bias_and_sample": lambda: sample(kgw.bias(logits.clone(), contexts().tolist())),
        "gumbel": lambda: gumbel.choose(logits, contexts()),
        "synthid_and_sample": lambda: sample(synthid.tournament_logits(logits, contexts())),
        "synthid_whole_vocabulary_and_sample": lambda: sample(synthid_full.tournament_logits(logits, contexts())),
        "hf_synthid_and_sample": lambda: sample(hf.tournament_logits(logits, contexts())),
    }
    out = {name: time_call(fn, repeats) for name, fn in cases.items()}
    base = out["sample"]["median_ms"]
    kgw_extra = out["kgw_bias_and_sample"]["median_ms"] - base
    for name, result in out.items():
        # gumbel replaces the sampler, the others run before it: either way the cost is over "sample"
        result["extra_over_sample_ms"] = result["median_ms"] - base
        result["extra_vs_kgw_bias"] = result["extra_over_sample_ms"] / kgw_extra if kgw_extra > 0 else None
    return out


def detection_rates(vocab, texts: list[str], repeats: int) -> dict:
    ids = [torch.tensor(encode(vocab, t)) for t in texts]
    tokens = sum(len(i) for i in ids)
    marks = {"gumbel": GumbelWatermark("gumbel:h=4", SECRET, vocab.vocab_size),
             "synthid": SynthIDWatermark("synthid:h=4,layers=30", SECRET, vocab.vocab_size),
             "hf_synthid": HFSynthID(HF_SPEC, vocab.vocab_size),
             "vllm_gumbel": VLLMGumbel("vllm:gumbel", SECRET, vocab.vocab_size)}
    out = {}
    for name, mark in marks.items():
        start = time.perf_counter()
        for i in ids:  # cold: first sight of every context, one PRF call each
            score_text(mark, i)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(repeats):
            for text in texts:
                score_text(mark, torch.tensor(encode(vocab, text)))
        warm = (time.perf_counter() - start) / repeats
        out[name] = {"cold_scoring_tokens_per_s": tokens / cold, "end_to_end_tokens_per_s": tokens / warm}
    model_config = LlamaConfig(vocab_size=vocab.vocab_size, bos_token_id=vocab.bos_token_id,
                               eos_token_id=vocab.eos_token_id, hidden_size=8, intermediate_size=8,
                               num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1)
    hf_detector = WatermarkDetector(model_config, "cpu", WatermarkingConfig(), ignore_repeated_ngrams=True)
    peer_texts = texts[:2]
    start = time.perf_counter()
    for text in peer_texts:
        hf_detector(torch.tensor([vocab.tokenizer(text, add_special_tokens=False).input_ids]), return_dict=True)
    peer_rate = sum(len(encode(vocab, t)) for t in peer_texts) / (time.perf_counter() - start)
    out["transformers_kgw_detector_end_to_end_tokens_per_s"] = peer_rate
    for name in marks:
        out[name]["speedup_vs_transformers_cold"] = out[name]["cold_scoring_tokens_per_s"] / peer_rate
        out[name]["speedup_vs_transformers_end_to_end"] = out[name]["end_to_end_tokens_per_s"] / peer_rate
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, threads=2, batch=16, repeats=20, texts=8)
    vocab = load_vocabulary()
    payload = {
        "benchmark": "sampling_watermarks",
        "command": "python benchmarks/sampling_watermarks.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
        "batch": args.batch,
        "vocab_size": vocab.vocab_size,
        "stage_ms_per_step": stage_costs(vocab.vocab_size, args.batch, args.repeats),
        "detection": detection_rates(vocab, corpus_texts(vocab, args.texts), 3),
    }
    write_json("sampling_watermarks", payload, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
