"""``provmark eval security --attack public-half``: the two-part key (``watermark.public_key``) against a spoofer
who holds its published half, on the real model.

One throw-away keyring with fixed secrets: a two-part key and, for comparison, a one-part key of the same spec.
On the evaluation's held-out news prompts, one text per prompt and set, ``tokens`` tokens at temperature 1
(sampling seeds shared across sets):

* ``unwatermarked``: the model alone;
* ``one_part``: our watermark with the one-part key (what the service writes today);
* ``two_part_delta_D``: our watermark with the two-part key, each half biased by D: the spec's delta, and
  delta / sqrt(2), which adds about the distortion of one list at delta (to first order the two lists' costs
  add up, as squares of delta);
* ``spoof_delta_D``: the model steered by the published half only, at bias D: the spoofer runs our own engine
  with the published half as its key (it needs nothing else), as hard as it likes.

plus the corpus's human article bodies. Every text is scored by the production detector under the two-part
key (the private half decides; ``public_half`` is what a public verifier concludes; ``spoof_suspected`` exactly
and as a ``detect`` token sees it) and the one-part texts under their own key. Prefixes of 50 / 100 / ``tokens``
tokens show what the second list costs or gives in detection power; perplexity under the model what it costs
the text. Generations are cached in ``OUT/cache``; ``OUT/results.json`` and ``OUT/public-half.png``.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from detector.service import Detector
from evaluation.cache import JsonlCache
from evaluation.corpus import prompt_documents
from evaluation.generations import GenerationSource
from evaluation.harness import PROMPT_TEMPLATE
from evaluation.lm import TeacherForcedLM
from evaluation.runner import chat_prompt_ids
from generation.engine import Engine
from generation.models import load_model
from watermark.config import WatermarkSpec
from watermark.keys import Keyring
from watermark.scheme import Watermark, generation_watermark
from watermark.schemes import family_of
from watermark.specs import parse_spec
from watermark.vocab import encode

TWO_PART_KEY, ONE_PART_KEY = "two-part", "one-part"


@dataclass(slots=True)
class PublicHalfConfig:
    texts: int = 40
    tokens: int = 200
    spoof_deltas: tuple[float, ...] = (2.0, 4.0)
    spec: str = WatermarkSpec.default().format()
    seed: int = 0
    max_num_seqs: int = 48

    @property
    def spec_delta(self) -> float:
        return WatermarkSpec.parse(self.spec).delta

    def __post_init__(self) -> None:
        for name in ("texts", "tokens", "max_num_seqs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{name}: expected an integer >= 2, got {value!r}")
        if not self.spoof_deltas or any(not 0 < d <= 20 for d in self.spoof_deltas):
            raise ValueError(f"spoof_delta: expected numbers in (0, 20], got {self.spoof_deltas!r}")
        if not family_of(parse_spec(self.spec)).two_part:
            raise ValueError("spec: a two-part key needs a kgw spec")


def run_public_half(config: PublicHalfConfig, out: str | Path, loaded=None, progress: bool = True) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    loaded = loaded if loaded is not None else load_model()
    vocab = loaded.vocab
    documents = prompt_documents(config.texts)
    prompts = [chat_prompt_ids(vocab.tokenizer, PROMPT_TEMPLATE.format(sentence=d.first_sentence)) for d in documents]
    engine = Engine(loaded, max_num_seqs=config.max_num_seqs,
                    max_model_len=max(len(p) for p in prompts) + config.tokens + 8)
    source = GenerationSource(engine, TeacherForcedLM(loaded), JsonlCache(out / "cache" / "generations.jsonl"),
                              vocab.fingerprint, progress)
    with tempfile.TemporaryDirectory(prefix="provmark-public-half-") as home:
        ring = Keyring(Path(home), master_key=bytes(32))  # throw-away; fixed secrets: reproducible
        for key_id in (TWO_PART_KEY, ONE_PART_KEY):
            ring.create(key_id, secret=random.Random(f"{config.seed}|{key_id}").randbytes(32), spec=config.spec,
                        public_half=key_id == TWO_PART_KEY)
        two = generation_watermark(None, vocab.vocab_size, TWO_PART_KEY, ring)
        one = generation_watermark(None, vocab.vocab_size, ONE_PART_KEY, ring)
        two_part = {f"two_part_delta_{d:.3g}": generation_watermark(two.spec.with_(delta=d), vocab.vocab_size,
                                                                   TWO_PART_KEY, ring)
                    for d in (two.spec.delta, round(two.spec.delta / math.sqrt(2), 2))}
        published = ring.public_half(TWO_PART_KEY)
        spoofers = {f"spoof_delta_{d:g}": Watermark(two.spec.with_(delta=d), published, vocab.vocab_size, "spoofer")
                    for d in config.spoof_deltas}
        fingerprints = {info.key_id: info.fingerprint for info in ring.list()}
        marks = {"unwatermarked": (None, None), "one_part": (one, fingerprints[ONE_PART_KEY]),
                 **{name: (mark, fingerprints[TWO_PART_KEY] + "+public-half") for name, mark in two_part.items()},
                 **{name: (mark, "published-half") for name, mark in spoofers.items()}}
        found = source.generate_sets(prompts, config.tokens, 1.0, config.seed, list(marks.values()),
                                     label="public-half texts")
        detector = Detector(vocab=vocab, keyring=ring)
        sets = {name: [g.token_ids for g in gens] for name, gens in zip(marks, found)}
        sets["human"] = [list(encode(vocab, d.body))[: config.tokens] for d in documents]
        decode = lambda ids: vocab.tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        results = {"config": asdict(config), "sets": {}}
        lengths = sorted({50, 100, config.tokens})
        for name, texts in sets.items():
            key = ONE_PART_KEY if name == "one_part" else TWO_PART_KEY
            section = {str(n): summarise([detector.detect(decode(ids[:n]), keys=[key]) for ids in texts])
                       for n in lengths}
            gens = found[list(marks).index(name)] if name in marks else None
            if gens is not None:  # under the unwatermarked model, given the prompt (heavy-tailed: quartiles)
                q1, median, q3 = statistics.quantiles([g.perplexity for g in gens], n=4)
                section["perplexity"] = {"q1": q1, "median": median, "q3": q3}
            results["sets"][name] = section
    (out / "results.json").write_text(json.dumps(results, indent=1))
    results["plot"] = str(plot(results, out / "public-half.png", config.tokens))
    return results


def summarise(verdicts) -> dict:
    """Rates over one set's verdicts: private (our verdict), public half, spoof flag (exact and detect view)."""
    n = len(verdicts)
    reports = [v.public_half for v in verdicts]
    shown = [v.disclose("detect") for v in verdicts]
    p_values = [r["spoof_test"]["p_value"] for r in reports if r is not None]
    finite = [v.z_score for v in verdicts if v.z_score is not None and math.isfinite(v.z_score)]
    return {
        "n": n,
        "private_watermarked": sum(v.watermarked for v in verdicts) / n,
        "public_watermarked": (sum(r["verdict"] == "watermarked" for r in reports if r) / n) if any(reports) else None,
        "spoof_suspected": sum(bool(v.to_dict()["spoof_suspected"]) for v in verdicts) / n,
        "spoof_suspected_detect_view": sum(bool(d["spoof_suspected"]) for d in shown) / n,
        "median_z": statistics.median(finite) if finite else None,
        "median_public_z": (statistics.median(r["z_score"] for r in reports if r and r["z_score"] is not None)
                            if any(reports) else None),
        "paired_p_at_most_1e-3": (sum(p <= 1e-3 for p in p_values) / len(p_values)) if p_values else None,
        "paired_p_at_most_0.05": (sum(p <= 0.05 for p in p_values) / len(p_values)) if p_values else None,
    }


def plot(results: dict, path: Path, tokens: int) -> Path:
    import matplotlib  # noqa: PLC0415 (matplotlib, heavy: loaded only to draw the plots)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (after choosing the Agg backend)

    names = list(results["sets"])
    rows = [results["sets"][n][str(tokens)] for n in names]
    measures = [("public_watermarked", "published half says watermarked"),
                ("private_watermarked", "our verdict (private half): watermarked"),
                ("spoof_suspected", "spoof_suspected")]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(measures)
    for j, (field, label) in enumerate(measures):
        ax.bar([i + j * width for i in range(len(names))], [r[field] or 0.0 for r in rows], width, label=label)
    ax.set_xticks([i + width for i in range(len(names))], names, rotation=15)
    ax.set_ylabel(f"fraction of texts ({tokens} tokens)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.set_title("two-part key: what the published half and the private half say")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
