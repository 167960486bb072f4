"""How an attack is called and seeded: ``Attack`` (name, family, function), the ``AttackContext`` it may
need (tokenizer, human filler, model), and each text's own generator (``text_rng``), so that the same
(text, rate, seed) always gives the same edit. The attacks themselves: evaluation/attacks.py and
evaluation/attacks_model.py."""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

WORD = re.compile(r"[A-Za-z][A-Za-z']*")


@dataclass(slots=True)
class AttackContext:
    """What attacks may need beyond the text: the tokenizer, human filler text, the model."""

    tokenizer: object
    human_texts: Sequence[str] = ()  # dilution filler, drawn at random
    lm: object | None = None  # evaluation.lm.TeacherForcedLM, for model-proposed substitutions
    engine: object | None = None  # generation.engine.Engine, for paraphrase
    _token_pool: list[int] | None = field(default=None, repr=False)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def token_pool(self) -> list[int]:
        """Ids of ordinary tokens (printable text, no special or partial-character tokens): what a
        random substitution or insertion draws from."""
        if self._token_pool is None:
            special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
            pool = []
            for token_id in range(len(self.tokenizer)):
                if token_id in special:
                    continue
                piece = self.decode([token_id])
                if piece.strip() and piece.isprintable() and "\ufffd" not in piece:
                    pool.append(token_id)
            self._token_pool = pool
        return self._token_pool


AttackFunction = Callable[[list[str], float, int, AttackContext], list[str]]


@dataclass(slots=True, frozen=True)
class Attack:
    name: str
    family: str  # token | word | character | dilution | paraphrase | truncation
    function: AttackFunction
    needs_model: bool = False
    rate_below_one: bool = False  # dilution and truncation: at rate 1 nothing of the text would be left
    description: str = ""

    def apply(self, texts: Sequence[str], rate: float, seed: int, context: AttackContext) -> list[str]:
        """The attacked texts, in order; rate 0 returns copies of the input."""
        check_rate(self, rate)
        if rate == 0:
            return list(texts)
        return self.function(list(texts), float(rate), int(seed), context)


def check_rate(attack: Attack, rate: float) -> None:
    """ValueError naming the attack when ``rate`` is outside what it takes."""
    top = "1)" if attack.rate_below_one else "1]"
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0 or \
            (attack.rate_below_one and rate >= 1.0):
        raise ValueError(f"rate: {attack.name} takes a rate in [0, {top}, got {rate!r}")


def text_rng(seed: int, name: str, rate: float, index: int) -> random.Random:
    """The generator for one text under one attack and rate (independent of everything else)."""
    material = f"provmark/attack|{seed}|{name}|{rate!r}|{index}".encode()
    return random.Random(int.from_bytes(hashlib.sha256(material).digest()[:8], "big"))


def choose(rng: random.Random, population: int, rate: float) -> list[int]:
    """round(rate x population) distinct indices, sorted."""
    count = min(population, round(rate * population))
    return sorted(rng.sample(range(population), count))


def per_text(name: str, edit: Callable[[str, float, random.Random, AttackContext], str]) -> AttackFunction:
    """Lift a one-text edit to an attack over a list, with each text's own generator."""
    def run(texts: list[str], rate: float, seed: int, context: AttackContext) -> list[str]:
        return [edit(text, rate, text_rng(seed, name, rate, i), context) for i, text in enumerate(texts)]
    return run
