"""The robustness evaluation's settings (``EvalConfig``) and what it measures; the run itself is
``evaluation.runner.run_evaluation(config, out_dir)``: generate, attack, detect, measure.

1. Prompts: the first sentences of the first ``n`` articles of the human corpus
   (``evaluation.corpus``), asked through the chat template ("Continue this news article: ...").
2. For every scheme, watermarked generations of exactly ``tokens`` tokens (end-of-text is held off
   until then, as in Kirchenbauer et al.'s T = 200 setting), plus one unwatermarked generation per
   prompt with the same sampling seed. Sampling at temperature 1: the watermark needs entropy.
   Generations and their perplexities are cached in ``out_dir/cache``; a rerun generates only what
   is missing.
3. Negatives: every corpus article body cut to ``tokens`` tokens (human) and the unwatermarked
   generations, scored with the scheme's key; and all texts scored with ``null_keys`` fresh keys
   that wrote none of them. The empirical thresholds for FPR 1% and 0.1% come from all of these.
4. Every attack at every rate on the watermarked texts, detection with the default detector
   settings (normalisation and dedup on, z threshold 4), then the metrics of ``evaluation.metrics``
   per scheme x attack x rate (see ``METRIC_DEFINITIONS``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from evaluation.attack_context import check_rate
from evaluation.attacks import ATTACK_NAMES, get_attack
from watermark import schemes
from watermark.specs import AnySpec, is_sampling, parse_spec

DEFAULT_RATES = (0.0, 0.1, 0.25, 0.5)
DEFAULT_FPRS = (0.01, 0.001)
PROMPT_TEMPLATE = "Continue this news article: {sentence}"
# Scheme names -> specs: our default, and the published settings they come from.
SCHEME_PRESETS = {
    "default": "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0",  # Kirchenbauer et al. 2024 (reliability)
    "selfhash": "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0",
    "minhash": "kgw:scheme=minhash,h=4,gamma=0.25,delta=2.0",
    "lefthash": "kgw:scheme=lefthash,h=1,gamma=0.25,delta=2.0",  # the 2023 paper's one-token context
    "unigram": "kgw:scheme=unigram,h=0,gamma=0.25,delta=2.0",  # Zhao et al. 2023 (fixed list)
    "kirchenbauer2023": "kgw:scheme=lefthash,h=1,gamma=0.5,delta=2.0",  # 2023 paper, Table 2 row
    **schemes.presets(),  # each family's own (gumbel: Aaronson's exponential minimum; synthid: Dathathri et al.)
}
# `--schemes compare`: the KGW context schemes, then every family's preset
COMPARE_SCHEMES = ("selfhash", "minhash", "lefthash", "unigram", *schemes.presets())
DEFAULT_EXACT_FPRS = (1e-3, 1e-5)  # rates too small to read off the negatives: exact p <= f

METRIC_DEFINITIONS = {
    "tpr_default": "fraction of attacked watermarked texts the detector calls watermarked with its defaults "
                   "(exact binomial p <= alpha = P(Z >= 4), normalisation and dedup on)",
    "tpr_at_fpr": "fraction of attacked watermarked texts with z >= the empirical threshold: the smallest z "
                  "that at most that fraction of the negatives reach (thresholds.num_negatives says how many)",
    "tpr_exact": "fraction of attacked watermarked texts whose exact p-value is <= f, for each f of "
                 "config.exact_fprs (the detector's own test at alpha f: valid at rates the negatives cannot resolve)",
    "roc_auc": "P(z of a random attacked watermarked text > z of a random negative), ties half",
    "median_z": "median z of the attacked watermarked texts (texts with nothing to score count as -inf)",
    "median_z_without_normalization": "the same with the detector's normalisation off (character attacks only)",
    "tokens_to_detect": "length in tokens of the shortest prefix the detector calls watermarked; median over "
                        "texts (None if more than half are never detected) and the fraction never detected",
    "detection_by_length": "fraction of texts whose first L tokens are detected, for each L",
    "perplexity": "exp(mean negative log-likelihood) of the generated tokens under the model given the prompt",
    "repetition_rate": "seq-rep-4 (Welleck et al. 2019): fraction of the text's token 4-grams that repeat an "
                       "earlier one",
    "by_length": "the clean watermarked texts cut to their first L tokens (config.lengths): tpr_exact[f] = "
                 "fraction whose exact p-value is <= f (the detector's own test at alpha f, valid for a fixed "
                 "key where the per-key null holds), repetition (seq-rep-4) and distinct-2/3 of those L tokens",
}


def parse_scheme(text: str) -> AnySpec:
    """A preset name (``SCHEME_PRESETS``) or a full spec string (kgw, hf, gumbel, synthid, ...)."""
    name = text.strip().lower()
    return parse_spec(SCHEME_PRESETS.get(name, text))


@dataclass(slots=True)
class EvalConfig:
    """What to evaluate; validated here so a bad value fails before the model loads."""

    n: int = 200
    tokens: int = 200
    schemes: tuple[str, ...] = ("default",)
    attacks: tuple[str, ...] = ATTACK_NAMES
    rates: tuple[float, ...] = DEFAULT_RATES
    seed: int = 0
    temperature: float = 1.0
    null_keys: int = 2
    deltas: tuple[float, ...] = ()  # extra deltas of the first scheme, for the quality-vs-delta curve
    fprs: tuple[float, ...] = DEFAULT_FPRS
    max_num_seqs: int = 32
    length_step: int = 25  # L grid of detection_by_length
    lengths: tuple[int, ...] = ()  # by_length: the clean texts' first L tokens (each L <= tokens)
    exact_fprs: tuple[float, ...] = DEFAULT_EXACT_FPRS
    attack_quality: bool = False  # perplexity of every attacked text too (a forward pass each)
    prompt_template: str = PROMPT_TEMPLATE
    specs: tuple[AnySpec, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        for name in ("n", "tokens", "max_num_seqs", "length_step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if isinstance(self.null_keys, bool) or not isinstance(self.null_keys, int) or not 0 <= self.null_keys <= 64:
            raise ValueError(f"null_keys: expected an integer in [0, 64], got {self.null_keys!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"seed: expected an integer, got {self.seed!r}")  # noqa: TRY004 (a config value)
        if not (isinstance(self.temperature, (int, float)) and 0 < self.temperature <= 5):
            raise ValueError(f"temperature: expected a number in (0, 5], got {self.temperature!r}")
        if not self.schemes:
            raise ValueError("schemes: expected at least one scheme")
        specs = []
        if "compare" in self.schemes:  # the side-by-side preset list, in place of the word
            i = self.schemes.index("compare")
            self.schemes = self.schemes[:i] + COMPARE_SCHEMES + self.schemes[i + 1:]
        for scheme in self.schemes:
            try:
                specs.append(parse_scheme(scheme))
            except ValueError as exc:
                raise ValueError(f"schemes: {scheme!r}: {exc}") from None
        self.specs = tuple(dict.fromkeys(specs))
        self.attacks = tuple(dict.fromkeys(self.attacks))
        rates = tuple(sorted({float(r) for r in self.rates}))
        if not rates:
            raise ValueError("rates: expected at least one rate")
        for name in self.attacks:
            attack = get_attack(name)  # ValueError naming the unknown attack
            for rate in rates:
                try:
                    check_rate(attack, rate)
                except ValueError as exc:
                    raise ValueError(f"rates: {exc}") from None
        self.rates = rates
        for d in self.deltas:
            if not isinstance(d, (int, float)) or not 0 <= d <= 20:
                raise ValueError(f"deltas: expected numbers in [0, 20], got {d!r}")
        self.deltas = tuple(sorted({float(d) for d in self.deltas}))
        for name in ("fprs", "exact_fprs"):
            for f in getattr(self, name):
                if not (isinstance(f, (int, float)) and 0 < f < 1):
                    raise ValueError(f"{name}: expected probabilities in (0, 1), got {f!r}")
        for length in self.lengths:
            if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= self.tokens:
                raise ValueError(f"lengths: expected integers in [1, tokens={self.tokens}], got {length!r}")
        self.lengths = tuple(sorted(set(self.lengths)))
        if self.deltas and is_sampling(self.specs[0]):
            raise ValueError("deltas: the quality-vs-delta curve needs a kgw first scheme (sampling watermarks "
                             "have no delta)")
        if "{sentence}" not in self.prompt_template:
            raise ValueError("prompt_template: must contain {sentence}")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["specs"] = [s.format() for s in self.specs]
        return out
