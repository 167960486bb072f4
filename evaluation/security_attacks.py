"""``provmark eval security --attack stealing|spoofing|scrubbing|all``: watermark stealing and what it buys.

Per scheme (default: ``kgw:scheme=lefthash,h=1`` -- the paper's weak case -- and the default spec), with a
fresh key bound to that spec in a throw-away keyring (fixed secrets: reproducible):

1. *Corpus*: watermarked texts of ``tokens`` tokens from our engine on the first ``TRAIN_PROMPTS`` prompts
   of the evaluation corpus, in seeded rounds until the largest N; the attacker keeps only the text.
2. *Stealing* (``evaluation.stealing``) from the first N tokens, for each N: accuracy of the estimated
   colours against the truth (the evaluator's key) on the units of held-out texts (the next prompts:
   the corpus's remaining articles, then Lee's test articles): unwatermarked (what a spoofer writes
   from) and watermarked (what a scrubber edits). ``estimator`` picks the thief: the paper's pair vote,
   ``learned-anchors`` (selfhash: which context token anchors, learned from the same text) or
   ``known-units`` (told by the key: an upper bound on any context-aware thief); the spoofing and
   scrubbing below use its table.
3. *Spoofing*: the base model steered by the stolen table on the held-out prompts, and human article
   bodies edited with it (``evaluation.spoofing``), scored by the real detector under the production key:
   success = detected (exact verdict, z >= 4 with the default options).
4. *Scrubbing*: held-out watermarked texts with a fraction ``rate`` of tokens replaced where the table
   believes green, against blind model substitutions (``token-substitute-lm``) at the same rate: TPR.

Generations are cached in ``OUT/cache`` (JSON lines), stolen counts as ``.npz``; ``OUT/results.json`` is
written section by section, so a rerun with the same settings resumes. One plot per attack.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from detector.service import Detector
from evaluation import attack_measures as measure
from evaluation import stealing
from evaluation.cache import JsonlCache, cache_key
from evaluation.corpus import held_out_documents, prompt_documents
from evaluation.generations import GenerationSource
from evaluation.harness import PROMPT_TEMPLATE, parse_scheme
from evaluation.lm import TeacherForcedLM
from evaluation.runner import chat_prompt_ids, scheme_label
from evaluation.stealing import ColourEstimate
from generation.engine import Engine
from generation.models import load_model
from watermark.keys import Keyring
from watermark.scheme import generation_watermark
from watermark.seeding import selfhash_salts
from watermark.units import MAX_GRAM
from watermark.vocab import encode

ATTACKS = ("stealing", "spoofing", "scrubbing")
TRAIN_PROMPTS = 250  # prompts the attacker queries; the corpus's next ones are held out
DEFAULT_SCHEMES = ("lefthash", "default")


@dataclass(slots=True)
class AttackConfig:
    attacks: tuple[str, ...] = ATTACKS
    schemes: tuple[str, ...] = DEFAULT_SCHEMES
    steal_tokens: tuple[int, ...] = (10_000, 30_000, 100_000)
    tokens: int = 200  # per generated text
    eval_texts: int = 40  # held-out prompts (and human texts) per measurement
    rates: tuple[float, ...] = (0.1, 0.2, 0.3, 0.5)
    spoof_delta: float = 4.0
    seed: int = 0
    max_num_seqs: int = 48
    # "pairs" (the paper's vote), "learned-anchors" (selfhash anchors learned from the text) or "known-units"
    # (the thief told every unit: an upper bound), evaluation.stealing
    estimator: str = "pairs"

    def __post_init__(self) -> None:

        bad = [a for a in self.attacks if a not in ATTACKS]
        if bad or not self.attacks:
            raise ValueError(f"attack: unknown {', '.join(bad) or '(none)'} (known: {', '.join(ATTACKS)}, all, oracle)")
        for scheme in self.schemes:
            try:
                if not parse_scheme(scheme).needs_key:
                    raise ValueError("an hf spec has no secret key to steal")
            except ValueError as exc:
                raise ValueError(f"schemes: {scheme!r}: {exc}") from None
        if not self.steal_tokens or any(isinstance(n, bool) or not isinstance(n, int) or n < 1000
                                         for n in self.steal_tokens):
            raise ValueError(f"steal_tokens: expected integers >= 1000, got {self.steal_tokens!r}")
        self.steal_tokens = tuple(sorted(set(self.steal_tokens)))
        for name in ("tokens", "eval_texts", "max_num_seqs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{name}: expected an integer >= 2, got {value!r}")
        if self.estimator not in stealing.ESTIMATORS:
            raise ValueError(f"estimator: expected one of {', '.join(stealing.ESTIMATORS)}, got {self.estimator!r}")
        if self.estimator == "learned-anchors" and any(parse_scheme(s).scheme == "minhash" for s in self.schemes):
            raise ValueError("estimator: learned-anchors learns selfhash anchors; minhash specs are not covered")
        if self.estimator != "pairs" and any(parse_scheme(s).scheme == "lefthash" and parse_scheme(s).context_width >= MAX_GRAM
                                             for s in self.schemes):
            raise ValueError(f"estimator: {self.estimator} names units, and lefthash units are named up to h = {MAX_GRAM - 1}")
        held_out = len(held_out_documents(TRAIN_PROMPTS))
        if self.eval_texts > held_out:
            raise ValueError(f"eval_texts: the corpus holds out {held_out} prompts, {self.eval_texts} asked for")
        if not self.rates or any(not 0 < r < 1 for r in self.rates):
            raise ValueError(f"rates: expected edit rates in (0, 1), got {self.rates!r}")
        self.rates = tuple(sorted(set(float(r) for r in self.rates)))
        if not 0 < self.spoof_delta <= 20:
            raise ValueError(f"spoof_delta: expected a number in (0, 20], got {self.spoof_delta!r}")

    @property
    def training_texts(self) -> int:
        """Generations the largest N needs (a text re-tokenizes to about ``tokens`` tokens: 5 % spare)."""
        return math.ceil(1.05 * max(self.steal_tokens) / self.tokens)

    @property
    def rounds(self) -> int:
        return math.ceil(self.training_texts / TRAIN_PROMPTS)


class AttackRun:
    """Everything one run shares: model, engine, generation cache, keys, detector."""

    def __init__(self, config: AttackConfig, out: Path, loaded=None, progress: bool = True) -> None:

        if loaded is None:

            loaded = load_model()
        self.config, self.out, self.progress = config, out, progress
        self.vocab = loaded.vocab
        tokenizer = self.vocab.tokenizer
        held_docs = held_out_documents(TRAIN_PROMPTS)[: config.eval_texts]
        self.train_prompts = [chat_prompt_ids(tokenizer, PROMPT_TEMPLATE.format(sentence=d.first_sentence))
                              for d in prompt_documents(TRAIN_PROMPTS)]
        self.eval_prompts = [chat_prompt_ids(tokenizer, PROMPT_TEMPLATE.format(sentence=d.first_sentence))
                             for d in held_docs]
        self.human_ids = [self.encode(d.body)[: config.tokens] for d in held_docs]
        self.lm = TeacherForcedLM(loaded)
        longest = max(len(p) for p in self.train_prompts + self.eval_prompts)
        self.engine = Engine(loaded, max_num_seqs=config.max_num_seqs, max_model_len=longest + config.tokens + 8)
        self.source = GenerationSource(self.engine, self.lm, JsonlCache(out / "cache" / "generations.jsonl"),
                                       self.vocab.fingerprint, progress)
        self._home = tempfile.TemporaryDirectory(prefix="provmark-stealing-")
        ring = Keyring(Path(self._home.name), master_key=bytes(32))  # throw-away; fixed secrets: reproducible
        self.specs, self.marks, self.key_fingerprints = {}, {}, {}
        for index, name in enumerate(config.schemes):
            spec = parse_scheme(name)
            label = _label(spec)
            info = ring.create(f"k{index}-{spec.scheme}-h{spec.context_width}",
                               secret=random.Random(f"{config.seed}|{label}").randbytes(32), spec=spec)
            self.specs[label] = spec
            self.marks[label] = generation_watermark(spec, self.vocab.vocab_size, info.key_id, ring)
            self.key_fingerprints[label] = info.fingerprint
        self.detector = Detector(vocab=self.vocab, keyring=ring)  # the production detector: keys bound to specs
        self._rows: dict[str, list] = {}  # per scheme, the base model's rows of the stolen text (_base_rows)

    def close(self) -> None:
        self._home.cleanup()

    def encode(self, text: str) -> list[int]:

        return list(encode(self.vocab, text))

    def decode(self, ids: list[int]) -> str:
        return self.vocab.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    # ------------------------------------------------------------------ texts
    def training_texts(self) -> dict[str, list]:
        """Per scheme, the watermarked training generations in order (round-major); all schemes share batches."""
        cfg = self.config
        labels = list(self.marks)
        sets = {label: [] for label in labels}
        for r in range(cfg.rounds):
            count = min(TRAIN_PROMPTS, cfg.training_texts - r * TRAIN_PROMPTS)
            found = self.source.generate_sets(
                self.train_prompts[:count], cfg.tokens, 1.0, cfg.seed + r,
                [(self.marks[lb], self.key_fingerprints[lb]) for lb in labels], label=f"watermarked corpus, round {r + 1}")
            for label, gens in zip(labels, found):
                sets[label] += gens
        return sets

    def held_out(self) -> dict[str, list]:
        """Held-out generations: "unwatermarked" and one watermarked set per scheme (other seeds, other prompts)."""
        labels = list(self.marks)
        found = self.source.generate_sets(
            self.eval_prompts, self.config.tokens, 1.0, self.config.seed + 1000,
            [(None, None)] + [(self.marks[lb], self.key_fingerprints[lb]) for lb in labels], label="held-out texts")
        return dict(zip(["unwatermarked"] + labels, found))

    def detect(self, label: str, texts: list[str]) -> list[dict]:
        spec, key = self.specs[label], self.marks[label].key_id
        out = []
        for text in texts:
            v = self.detector.detect(text, keys=[key], spec=spec)
            z = v.z_score
            out.append({"z": None if z is None or not math.isfinite(z) else float(z), "detected": v.verdict == "watermarked"})
        return out

    def stolen_counts(self, label: str, texts: list, tokens: int, namer=None):
        """The attacker's counts from the first ``tokens`` watermarked tokens (re-tokenized text), cached: pair
        counts (``stealing.accumulate``), or with ``namer`` unit counts (``stealing.accumulate_units``) under
        the units ``namer`` names (the key for known-units, the learned anchors for learned-anchors)."""

        mark = self.marks[label]
        extra = {} if namer is None else {"estimator": self.config.estimator}  # pairs: the older runs' cache key
        digest = cache_key(label=label, key=self.key_fingerprints[label], n=tokens, seed=self.config.seed,
                           t=self.config.tokens, rounds=self.config.rounds, **extra)
        path = self.out / "cache" / f"stolen-{digest[:20]}.npz"
        kind = stealing.StolenCounts if namer is None else stealing.UnitCounts
        if path.exists():
            return kind.load(path)
        rows = self._base_rows(label, texts, tokens)
        if namer is None:
            counts = stealing.accumulate(rows, self.vocab.vocab_size, mark.context_width, mark.spec.scheme == "selfhash")
        else:
            counts = stealing.accumulate_units(rows, namer)
        path.parent.mkdir(parents=True, exist_ok=True)
        counts.save(path)
        return counts

    def _base_rows(self, label: str, texts: list, tokens: int) -> list:
        """``(ids, top-k ids, top-k probs)`` of the first ``tokens`` stolen tokens: one base-model pass over the
        largest N's texts, sliced for the smaller ones (teacher forcing: a prefix's rows are the prefix)."""
        found = self._rows.get(label)
        largest = max(self.config.steal_tokens)
        path = self.out / "cache" / "base-{}.npz".format(cache_key(
            label=label, key=self.key_fingerprints[label], n=largest, seed=self.config.seed, t=self.config.tokens,
            rounds=self.config.rounds, top_k=stealing.TOP_K)[:20])
        if found is None and path.exists():
            found = self._rows[label] = stealing.load_rows(path)
        if found is None:
            sequences, starts, left = [], [], largest
            for g in texts:
                if left <= 0:
                    break
                ids = self.encode(g.text)[:left]
                if ids:  # a text that re-tokenizes to nothing is skipped
                    sequences.append(list(g.prompt_ids) + ids)
                    starts.append(len(g.prompt_ids))
                    left -= len(ids)
            top = stealing.base_topk(self.lm, sequences, starts, progress=self.progress)
            found = self._rows[label] = [(seq[s:], ids, probs) for seq, s, (ids, probs) in zip(sequences, starts, top)]
            path.parent.mkdir(parents=True, exist_ok=True)
            stealing.save_rows(path, found)  # the other estimator's run reads it instead of a second pass
        out, left = [], tokens
        for ids, top_ids, probs in found:
            if left <= 0:
                break
            out.append((ids[:left], top_ids[:left], probs[:left]))
            left -= len(out[-1][0])
        return out

    def estimate(self, label: str, texts: list, tokens: int):
        """The attacker's colour table from the first ``tokens`` watermarked tokens (``config.estimator``)."""
        estimator, mark = self.config.estimator, self.marks[label]
        if estimator == "pairs":
            return ColourEstimate(self.stolen_counts(label, texts, tokens))
        namer = mark  # known-units; and for lefthash and unigram the unit is key-free: nothing to learn
        if estimator == "learned-anchors" and mark.spec.scheme == "selfhash":
            namer = stealing.LearnedAnchors(self.stolen_counts(label, texts, tokens), selfhash_salts(self.vocab.vocab_size))
        return stealing.KnownUnitEstimate(self.stolen_counts(label, texts, tokens, namer), namer)


def _label(spec) -> str:

    return scheme_label(spec)


def run_attacks(config: AttackConfig, out_dir: str | Path, loaded=None, progress: bool = True) -> dict:
    """Run the attacks of ``config``; writes and returns ``OUT/results.json``'s content."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items() if k != "attacks"}
    results = json.loads(path.read_text()) if path.exists() else {}
    if results.get("config") != settings:
        results = {"config": settings}
    run = AttackRun(config, out, loaded, progress)
    try:
        corpus = run.training_texts()
        held = run.held_out()

        estimates = {(label, n): run.estimate(label, corpus[label], n)
                     for label in run.marks for n in config.steal_tokens
                     if set(config.attacks) - set(results.get(label, {}).get(str(n), {}))}
        if "spoofing" in config.attacks:  # every steered set in shared batches: one pass, not one per N
            measure.spoof_generations(run, estimates)
        for label in run.marks:
            for n in config.steal_tokens:
                section = results.setdefault(label, {}).setdefault(str(n), {})
                for attack in config.attacks:
                    if attack not in section:
                        section[attack] = getattr(measure, attack)(run, label, estimates[label, n], held, n)
                        _write(path, results)
            if "control" not in results[label]:
                results[label]["control"] = measure.control(run, label, held)
                _write(path, results)
    finally:
        run.close()
    results["plots"] = measure.plot(results, config, out)
    _write(path, results)
    return results


def _write(path: Path, results: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=float))
    tmp.replace(path)
