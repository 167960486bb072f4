"""One evaluation run, step by step, and ``run_evaluation`` that runs one and writes results.json (see
``evaluation.harness`` for the settings and what is measured)."""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from evaluation import metrics
from evaluation.attack_context import AttackContext
from evaluation.attacks import get_attack
from evaluation.cache import JsonlCache, cache_key
from evaluation.corpus import load_documents, prompt_documents
from evaluation.generations import GenerationSource
from evaluation.harness import METRIC_DEFINITIONS, EvalConfig
from evaluation.lm import TeacherForcedLM
from evaluation.own_output_layers import FMRS, OwnOutputLayers
from evaluation.report import write_plots
from evaluation.scorer import Scorer
from evaluation.vllm_generator import VLLMGenerator
from generation.engine import Engine
from generation.models import load_model
from watermark.keys import Keyring
from watermark.scheme import generation_watermark
from watermark.schemes import family_of
from watermark.specs import AnySpec, is_sampling
from watermark.stats import z_for_p

CHARACTER_FAMILY = "character"


@dataclass(frozen=True, slots=True)
class RunSetup:
    """What a run uses beside its config: the model (None: the embedded one), the keyring and key that
    watermark (None: the keyring's active key; one is created on an empty keyring), a progress bar, where
    detection runs (``inline``, ``local`` on ``detect_workers`` processes, or ``ray`` at ``ray_address``:
    ``evaluation.scorer``) and what generates (``engine``, or ``vllm`` with the model folder ``vllm_model``)."""

    loaded: object = None
    keyring: object = None
    key_id: str | None = None
    progress: bool = True
    detect_backend: str = "inline"
    detect_workers: int | None = None
    ray_address: str | None = None
    generate_backend: str = "engine"
    vllm_model: str | None = None


@dataclass(frozen=True, slots=True)
class SchemeCells:
    """What every cell of one scheme is measured against: the spec and its watermark, the scorer, the
    negatives' z-scores and thresholds, the generations and the teacher-forced LM."""

    spec: AnySpec
    wm: object
    scorer: Scorer
    negatives: list
    thresholds: dict
    generations: list
    lm: TeacherForcedLM


class EvaluationRun:
    def __init__(self, config: EvalConfig, out: Path, setup: RunSetup = RunSetup()):
        loaded, keyring, key_id, generate_backend = setup.loaded, setup.keyring, setup.key_id, setup.generate_backend
        vllm_model, progress = setup.vllm_model, setup.progress
        detect_backend = (setup.detect_backend, setup.detect_workers, setup.ray_address)
        if generate_backend not in ("engine", "vllm"):
            raise ValueError(f"generate_backend={generate_backend!r}: choose engine or vllm")
        self.config = config
        self.generate_backend = generate_backend  # vllm: evaluation.vllm_generator (our plugin in vLLM)
        self.vllm_model = vllm_model
        self.detect_backend = detect_backend  # (backend, workers, ray address): see evaluation.scorer
        self.out = out
        self.progress = progress
        self.keyring = keyring if keyring is not None else Keyring()
        self.key_id = key_id
        if loaded is None:
            loaded = load_model()
        self.loaded = loaded
        self.vocab = loaded.vocab
        self.attack_cache = JsonlCache(out / "cache" / "attacks.jsonl")
        self.new_attack_texts = 0

    # ----------------------------------------------------------------------------- the flow
    def execute(self) -> dict:
        cfg = self.config
        lm = TeacherForcedLM(self.loaded)
        documents = prompt_documents(cfg.n)
        tokenizer = self.vocab.tokenizer
        prompts = [chat_prompt_ids(tokenizer, cfg.prompt_template.format(sentence=d.first_sentence))
                   for d in documents]
        marks = [self._watermark(spec) for spec in cfg.specs]
        extra = [self._watermark(cfg.specs[0], d) for d in cfg.deltas if d not in (0, cfg.specs[0].delta)]
        rows = cfg.n * (1 + len(marks) + len(extra))
        engine = Engine(self.loaded, max_num_seqs=min(cfg.max_num_seqs, rows),
                        max_model_len=max(len(p) for p in prompts) + cfg.tokens + 8)
        generator, fingerprint = engine, self.vocab.fingerprint
        if self.generate_backend == "vllm":
            # its own cache keys: vLLM's sampled tokens differ from our engine's for the same seed
            generator, fingerprint = VLLMGenerator(self.keyring, self.vllm_model), f"{fingerprint}|vllm"
        source = GenerationSource(generator, lm, JsonlCache(self.out / "cache" / "generations.jsonl"),
                                  fingerprint, self.progress)
        human = self._human_negatives(lm, tokenizer)
        context = AttackContext(tokenizer, human_texts=[d.body for d in load_documents() if d.body],
                                lm=lm, engine=engine)
        unwatermarked, *generated = source.generate_sets(  # one pass for every set: rows share batches
            prompts, cfg.tokens, cfg.temperature, cfg.seed,
            [(None, None)] + [(wm, self._key_fingerprint(wm)) for wm in marks + extra], label="generate")
        backend, workers, ray_address = self.detect_backend
        scorer = Scorer(self.vocab, self.keyring, cfg.null_keys, cfg.seed, backend, workers, ray_address)
        schemes, delta_points = [], []
        try:
            for spec, wm, generations in zip(cfg.specs, marks, generated):
                schemes.append(self._evaluate_scheme(spec, wm, generations, unwatermarked, human, scorer, context, lm))
            delta_points = self._quality_vs_delta(source, prompts, unwatermarked, scorer)
        finally:
            scorer.close()
        return {
            "config": cfg.to_dict(),
            "model": {"model_id": self.vocab.model_id, "tokenizer_fingerprint": self.vocab.fingerprint},
            "key_id": self.key_id,
            "definitions": METRIC_DEFINITIONS,
            "schemes": schemes,
            "quality_vs_delta": delta_points,
            "stats": {"generated_requests": source.generated, "reused_generations": source.reused,
                      "new_model_attack_texts": self.new_attack_texts},
        }

    def _watermark(self, spec: AnySpec, delta: float | None = None):
        if delta is not None:
            spec = spec.with_(delta=delta)
        wm = generation_watermark(spec, self.vocab.vocab_size, key_id=self.key_id if spec.needs_key else None,
                                  keyring=self.keyring, create_if_missing=True)
        if spec.needs_key:
            self.key_id = wm.key_id
        return wm

    def _key_fingerprint(self, wm) -> str | None:
        if wm.key_id is None:
            return None
        return next(k.fingerprint for k in self.keyring.list() if k.key_id == wm.key_id)

    def _human_negatives(self, lm, tokenizer) -> list[str]:
        """Every article body cut to ``tokens`` tokens."""
        out = []
        for d in load_documents():
            ids = lm.encode(d.body)[: self.config.tokens]
            if ids:
                out.append(tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))
        return out

    # ----------------------------------------------------------------------------- one scheme
    def _evaluate_scheme(self, spec, wm, generations, unwatermarked, human, scorer, context, lm) -> dict:
        cfg = self.config
        texts = [g.text for g in generations]
        human_z = scorer.z_scores(human, spec, wm.key_id)
        unwm_z = scorer.z_scores([g.text for g in unwatermarked], spec, wm.key_id)
        null_z = scorer.null_z_scores(human + [g.text for g in unwatermarked] + texts, spec)
        negatives = human_z + unwm_z + null_z
        thresholds = {f"{f:g}": metrics.empirical_threshold(negatives, f) for f in cfg.fprs}
        cells = []
        jobs = [(a, r) for a in cfg.attacks for r in cfg.rates if not (r == 0 and a != cfg.attacks[0])]
        bar = None
        if self.progress:
            bar = tqdm(total=len(jobs), desc=f"attacks {scheme_label(spec)}", unit="cell")
        clean = None
        layers = OwnOutputLayers(self.vocab, generations)  # the service's memory of these outputs
        for name, rate in jobs:
            attacked = self._attacked(name, rate, texts, context)
            cell = self._cell(name, rate, attacked,
                              SchemeCells(spec, wm, scorer, negatives, thresholds, generations, lm))
            # the watermark at the verdict's own threshold for alpha = f, the 5-gram and the semantic match
            cell["own_output_layers"] = layers.measure(attacked, [s for s in cell.pop("_z")],
                                                       {f"{f:g}": z_for_p(f) for f in FMRS})
            if rate == 0:
                clean = cell
            cells.append(cell)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        for name in cfg.attacks[1:]:  # rate 0 is the same clean texts for every attack
            if 0.0 in cfg.rates:
                cells.append({**clean, "attack": name})
        cells.sort(key=lambda c: (cfg.attacks.index(c["attack"]), c["rate"]))
        return {
            "spec": spec.format(),
            "scheme": scheme_name(spec),
            "label": scheme_label(spec),
            "key_id": wm.key_id,
            "thresholds": {"empirical_z": thresholds, "default_z": 4.0, "default_alpha": scorer.last_alpha.get(spec.format()),
                           "num_negatives": len(negatives)},
            "negatives": {
                "human": _negative_summary(human_z, scorer, spec),
                "unwatermarked": _negative_summary(unwm_z, scorer, spec),
                "null_keys": {"num_keys": cfg.null_keys, **_negative_summary(null_z, scorer, spec)},
            },
            "quality": {
                "watermarked": _quality(generations),
                "unwatermarked": _quality(unwatermarked),
                "perplexity_ratio": _ratio(_quality(generations), _quality(unwatermarked)),
            },
            "results": cells,
        }

    def _attacked(self, name: str, rate: float, texts: list[str], context: AttackContext) -> list[str]:
        attack = get_attack(name)
        if rate == 0 or not attack.needs_model:
            return attack.apply(texts, rate, self.config.seed, context)
        keys = [cache_key(kind="attack", attack=name, rate=rate, seed=self.config.seed, index=i,
                          text=hashlib.sha256(t.encode("utf-8", "surrogatepass")).hexdigest())
                for i, t in enumerate(texts)]
        missing = [i for i, k in enumerate(keys) if k not in self.attack_cache]
        if missing:
            # attacks are seeded per text index: run on the whole list so indices match, keep what is missing
            fresh = attack.apply(texts, rate, self.config.seed, context)
            self.attack_cache.put_many({keys[i]: fresh[i] for i in missing})
            self.new_attack_texts += len(missing)
        return [self.attack_cache.get(k) for k in keys]

    def _cell(self, name, rate, attacked, scheme: SchemeCells) -> dict:
        cfg = self.config
        spec, wm, scorer, negatives = scheme.spec, scheme.wm, scheme.scorer, scheme.negatives
        thresholds, generations, lm = scheme.thresholds, scheme.generations, scheme.lm
        scored = scorer.score(attacked, spec, wm.key_id, prefixes=True)
        z = [s["z"] for s in scored]
        curves = [s["prefix"] for s in scored]
        needed = [metrics.tokens_to_detect(c) for c in curves]
        never = sum(n is None for n in needed)
        longest = max((c.shape[0] - 1 for c in curves), default=0)
        lengths = list(range(cfg.length_step, max(longest, cfg.length_step) + 1, cfg.length_step))
        cell = {
            "attack": name,
            "rate": rate,
            "n": len(attacked),
            "tpr_default": float(np.mean([s["detected"] for s in scored])),
            "tpr_at_fpr": {k: metrics.detection_rate(z, t) for k, t in thresholds.items()},
            "tpr_exact": {f"{f:g}": float(np.mean([s["p_value"] <= f for s in scored])) for f in cfg.exact_fprs},
            "roc_auc": metrics.roc_auc(z, negatives),
            "median_z": metrics.summary(z)["median"] if any(v is not None for v in z) else None,
            "z": metrics.summary(z),
            "tokens_to_detect": {
                "median": _median_or_none(needed),
                "never_detected_fraction": never / len(needed) if needed else None,
            },
            "detection_by_length": {"lengths": lengths, "rate": metrics.detection_by_length(curves, lengths)},
            "roc": metrics.roc_curve(z, negatives),
            "_z": z,  # taken out by the caller (own_output_layers)
        }
        if rate == 0 and cfg.lengths:
            cell["by_length"] = _by_length(cfg, scored, generations)
        if get_attack(name).family == CHARACTER_FAMILY and rate > 0:
            raw = scorer.z_scores(attacked, spec, wm.key_id, normalize=False)
            cell["median_z_without_normalization"] = metrics.summary(raw)["median"]
            cell["tpr_default_without_normalization"] = float(np.mean(scorer.last_detected))
        if cfg.attack_quality:
            sequences = [g.prompt_ids + lm.encode(t) for g, t in zip(generations, attacked)]
            logprobs = lm.token_logprobs(sequences, [len(g.prompt_ids) for g in generations])
            cell["perplexity"] = metrics.summary([metrics.perplexity(lp) for lp in logprobs])
        return cell

    # ----------------------------------------------------------------------------- quality vs delta
    def _quality_vs_delta(self, source, prompts, unwatermarked, scorer) -> list[dict]:
        cfg = self.config
        base = cfg.specs[0]
        if is_sampling(base):  # no delta to vary (EvalConfig refuses deltas for it)
            return []
        base_key = self._watermark(base).key_id
        clean = scorer.score([g.text for g in unwatermarked], base, base_key)  # delta 0: the false-positive rate
        points = [{"delta": 0.0, "spec": None, "quality": _quality(unwatermarked),
                   "tpr_default": float(np.mean([s["detected"] for s in clean])),
                   "median_z": metrics.summary([s["z"] for s in clean])["median"]}]
        for delta in sorted(set(cfg.deltas) | {base.delta}):
            if delta == 0:
                continue
            wm = self._watermark(base, delta)
            generations = source.generate(prompts, cfg.tokens, cfg.temperature, cfg.seed, wm,
                                          self._key_fingerprint(wm), label=f"delta {delta:g}")
            scored = scorer.score([g.text for g in generations], wm.spec, wm.key_id)
            points.append({"delta": delta, "spec": wm.spec.format(), "quality": _quality(generations),
                           "tpr_default": float(np.mean([s["detected"] for s in scored])),
                           "median_z": metrics.summary([s["z"] for s in scored])["median"]})
        return points


def chat_prompt_ids(tokenizer, content: str) -> list[int]:
    """Prompt ids of one user message through the model's chat template (as ``Engine.apply_chat_template``;
    computed before the engine exists because the prompts' lengths size its cache)."""
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                            tokenize=True)
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]


def scheme_name(spec: AnySpec) -> str:
    """The scheme's name: selfhash, lefthash, ... for the green-list families; else the family's name."""
    return spec.scheme if family_of(spec).green_list else family_of(spec).name


def scheme_label(spec: AnySpec) -> str:
    """A short name for plots and file names, e.g. ``selfhash-h4-g0.25-d2``, ``gumbel-h4``, ``synthid-h4-m30``."""
    return family_of(spec).label(spec)


def _by_length(cfg, scored: list[dict], generations) -> dict:
    """The clean texts' first L tokens, for each L of ``cfg.lengths`` (``METRIC_DEFINITIONS["by_length"]``)."""
    out = {}
    for length in cfg.lengths:
        p = [row["prefix_p"][min(length, row["prefix_p"].shape[0] - 1)] for row in scored]
        heads = [g.token_ids[:length] for g in generations]
        out[str(length)] = {
            "tpr_exact": {f"{f:g}": float(np.mean([v <= f for v in p])) for f in cfg.exact_fprs},
            "repetition_rate": float(np.mean([metrics.repetition_rate(h) for h in heads])),
            **{f"distinct_{n}": float(np.nanmean([metrics.distinct_n(h, n) for h in heads])) for n in metrics.DISTINCT_N},
        }
    return out


def _quality(generations) -> dict:
    ppl = metrics.summary([g.perplexity for g in generations])
    rep = metrics.summary([g.repetition_rate for g in generations])
    return {"perplexity_median": ppl["median"], "perplexity_mean": ppl["mean"], "perplexity_q1": ppl["q1"],
            "perplexity_q3": ppl["q3"], "repetition_rate_mean": rep["mean"],
            "tokens_mean": float(np.mean([len(g.token_ids) for g in generations])) if generations else None,
            **{f"distinct_{n}_mean": float(np.nanmean([metrics.distinct_n(g.token_ids, n) for g in generations]))
               if generations else None for n in metrics.DISTINCT_N}}


def _ratio(a: dict, b: dict) -> float | None:
    if a["perplexity_median"] is None or not b["perplexity_median"]:
        return None
    return a["perplexity_median"] / b["perplexity_median"]


def _negative_summary(z: list, scorer, spec) -> dict:
    values = metrics.as_scores(z)
    finite = values[np.isfinite(values)]
    return {"n": len(z), "max_z": float(finite.max()) if finite.size else None,
            "median_z": float(np.median(finite)) if finite.size else None,
            "fraction_at_or_above_4": float(np.mean(values >= 4.0)) if values.size else None}


def _median_or_none(values: list) -> float | None:
    """Median with never-detected texts as +inf; None when that median is infinite."""
    arr = np.array([np.inf if v is None else v for v in values], dtype=np.float64)
    if arr.size == 0:
        return None
    median = float(np.median(arr))
    return median if np.isfinite(median) else None


def run_evaluation(config: EvalConfig, out_dir: str | Path, setup: RunSetup = RunSetup(), *,
                   make_plots: bool = True) -> dict:
    """Run ``config`` with ``setup`` (``RunSetup``: model, key, where detection runs, what generates) and
    write ``out_dir/results.json`` (and the plots); returns the results. Cached generations under
    ``out_dir/cache`` are reused; the detection backends give the same verdicts (``evaluation.scorer``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    run = EvaluationRun(config, out, setup)
    results = run.execute()
    results["stats"]["seconds"] = round(time.monotonic() - started, 1)
    if make_plots:
        results["plots"] = write_plots(results, out)
    (out / "results.json").write_text(json.dumps(_json_safe(results), indent=1, allow_nan=False), encoding="utf-8")
    return results


def _json_safe(value):
    """NaN and infinities -> None, so results.json is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value
