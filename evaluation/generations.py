"""Watermarked and unwatermarked generations for an evaluation, through the engine, cached on disk.

A generation is keyed by everything that decides it: model and tokenizer fingerprint, prompt ids,
watermark spec fingerprint and the key's public fingerprint, length, temperature and seed. Each
batch is written to the cache as soon as it is done (with its perplexity under the model given the
prompt), so an interrupted run loses at most one batch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from tqdm import tqdm

from evaluation.cache import JsonlCache, cache_key
from evaluation.metrics import perplexity, repetition_rate
from generation.sample.sampler import SamplingParams


@dataclass(slots=True)
class Generation:
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    perplexity: float
    repetition_rate: float
    finish_reason: str


def request_seed(seed: int, index: int) -> int:
    """The sampling seed of prompt ``index``: shared by its watermarked and unwatermarked versions."""
    digest = hashlib.sha256(f"provmark/eval-seed|{seed}|{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class GenerationSource:
    """``GenerationSource(engine, lm, cache, model_fingerprint)``: ``generate(prompts, tokens, ...)``."""

    def __init__(self, engine, lm, cache: JsonlCache, model_fingerprint: str, progress: bool = True) -> None:
        self.engine = engine
        self.lm = lm
        self.cache = cache
        self.model_fingerprint = model_fingerprint
        self.progress = progress
        self.generated = 0  # requests run by the engine in this process (0 on a fully cached rerun)
        self.reused = 0

    def generate(self, prompts: list[list[int]], tokens: int, temperature: float, seed: int,
                 watermark=None, key_fingerprint: str | None = None, label: str = "generate") -> list[Generation]:
        """One generation of exactly ``tokens`` tokens per prompt (ids), in order."""
        return self.generate_sets(prompts, tokens, temperature, seed, [(watermark, key_fingerprint)], label)[0]

    def generate_sets(self, prompts: list[list[int]], tokens: int, temperature: float, seed: int,
                      marks: list[tuple], label: str = "generate") -> list[list[Generation]]:
        """For each (watermark or None, key fingerprint) in ``marks``, one generation per prompt.

        What is missing from the cache runs in shared batches (rows of different watermarks side
        by side), so generating the unwatermarked and watermarked sets costs one pass, not two."""
        keys = [[self._key(p, i, wm, fp, tokens, temperature, seed) for i, p in enumerate(prompts)] for wm, fp in marks]
        missing = [(s, i) for s, row in enumerate(keys) for i, k in enumerate(row) if k not in self.cache]
        self.reused += sum(len(row) for row in keys) - len(missing)
        chunk = max(1, self.engine.config.max_num_seqs)
        bar = None
        if missing and self.progress:
            bar = tqdm(total=len(missing), desc=label, unit="text")
        try:
            for start in range(0, len(missing), chunk):
                batch = missing[start: start + chunk]
                params = [SamplingParams(max_new_tokens=tokens, min_new_tokens=tokens, temperature=temperature,
                                         seed=request_seed(seed, i)) for _, i in batch]
                outputs = self.engine.generate([prompts[i] for _, i in batch], params,
                                               watermarks=[marks[s][0] for s, _ in batch], use_tqdm=False)
                logprobs = self.lm.token_logprobs([prompts[i] + out.token_ids for (_, i), out in zip(batch, outputs)],
                                                  [len(prompts[i]) for _, i in batch])
                records = {}
                for (s, i), out, lp in zip(batch, outputs, logprobs):
                    records[keys[s][i]] = {"prompt_ids": prompts[i], "token_ids": out.token_ids, "text": out.text,
                                           "perplexity": perplexity(lp),
                                           "repetition_rate": repetition_rate(out.token_ids),
                                           "finish_reason": out.finish_reason}
                self.cache.put_many(records)
                self.generated += len(batch)
                if bar is not None:
                    bar.update(len(batch))
        finally:
            if bar is not None:
                bar.close()
        return [[Generation(**self.cache.get(k)) for k in row] for row in keys]

    def _key(self, prompt, index, watermark, key_fingerprint, tokens, temperature, seed) -> str:
        spec_id = watermark.fingerprint if watermark is not None else "none"
        return cache_key(kind="generation", model=self.model_fingerprint, prompt=prompt, spec=spec_id,
                         key=key_fingerprint, tokens=tokens, temperature=temperature, seed=request_seed(seed, index))
