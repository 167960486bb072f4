"""Edits an adversary (or an ordinary editor) makes to watermarked text, each at a rate in [0, 1].

Every attack is a function ``(texts, rate, seed, context) -> texts``. Rate 0 returns the texts
unchanged; the same (text, rate, seed) always gives the same result: each text draws from its own
``random.Random`` seeded by (seed, attack name, rate, text index), so adding texts or attacks to a
run does not change the others' edits.

What ``rate`` means, per family:
  token-*       a fraction ``rate`` of the text's tokens (model tokenizer) is edited:
                delete, insert a token after, substitute (uniform random token or one drawn from the
                model's distribution in context), swap with the next token (disjoint pairs)
  word-*        a fraction of the words: replaced by a word the model proposes in context,
                misspelt (typo), or case-changed
  homoglyph     a fraction of the letters that have a Cyrillic/Greek look-alike are swapped for it
  zero-width    a zero-width character is inserted after a fraction of the characters
  dilution      the watermarked text becomes a fraction 1 - rate of a longer text, the rest human
                text around it (rate < 1)
  paraphrase    a fraction of the sentences is rewritten by the instruct model (rate 1: all)
  truncation    the last fraction of tokens is cut: the text keeps its first (1 - rate) T tokens

The model-driven attacks (token-substitute-lm, word-lm, paraphrase) live in
``evaluation.attacks_model`` and need ``AttackContext.lm`` / ``.engine``.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from detector.normalize import HOMOGLYPHS

ZERO_WIDTH = ("\u200b", "\u200c", "\u200d", "\u2060", "\ufeff")  # ZWSP, ZWNJ, ZWJ, word joiner, BOM
# Latin letter -> its look-alikes (the inverse of the normaliser's table: what it must undo)
LOOKALIKES: dict[str, list[str]] = {}
for _fake, _latin in HOMOGLYPHS.items():
    LOOKALIKES.setdefault(_latin, []).append(_fake)
# QWERTY neighbours for keyboard typos
_KEYBOARD_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
KEY_NEIGHBOURS = {
    ch: "".join(row[j] for j in (i - 1, i + 1) if 0 <= j < len(row))
    for row in _KEYBOARD_ROWS for i, ch in enumerate(row)
}
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


# ---------------------------------------------------------------------------- token edits
def _token_delete(text: str, rate: float, rng: random.Random, ctx: AttackContext) -> str:
    ids = ctx.encode(text)
    drop = set(choose(rng, len(ids), rate))
    return ctx.decode([t for i, t in enumerate(ids) if i not in drop])


def _token_insert(text: str, rate: float, rng: random.Random, ctx: AttackContext) -> str:
    ids, pool = ctx.encode(text), ctx.token_pool()
    after = set(choose(rng, len(ids), rate))
    out = []
    for i, t in enumerate(ids):
        out.append(t)
        if i in after:
            out.append(rng.choice(pool))
    return ctx.decode(out)


def _token_substitute(text: str, rate: float, rng: random.Random, ctx: AttackContext) -> str:
    ids, pool = ctx.encode(text), ctx.token_pool()
    for i in choose(rng, len(ids), rate):
        replacement = ids[i]
        while replacement == ids[i]:
            replacement = rng.choice(pool)
        ids[i] = replacement
    return ctx.decode(ids)


def _token_swap(text: str, rate: float, rng: random.Random, ctx: AttackContext) -> str:
    ids = ctx.encode(text)
    pairs = choose(rng, len(ids) // 2, rate)  # disjoint pairs (2k, 2k+1): a fraction rate of tokens move
    for k in pairs:
        ids[2 * k], ids[2 * k + 1] = ids[2 * k + 1], ids[2 * k]
    return ctx.decode(ids)


# ---------------------------------------------------------------------------- word edits
def typo(word: str, rng: random.Random) -> str:
    """One misspelling: swap two neighbouring letters, drop, double, or hit a neighbouring key."""
    if len(word) < 2:
        return word + word
    i = rng.randrange(len(word) - 1)
    kind = rng.choice(("swap", "drop", "double", "key"))
    if kind == "swap" and word[i] != word[i + 1]:
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if kind == "drop":
        return word[:i] + word[i + 1:]
    if kind == "key" and word[i].lower() in KEY_NEIGHBOURS:
        key = rng.choice(KEY_NEIGHBOURS[word[i].lower()])
        return word[:i] + (key.upper() if word[i].isupper() else key) + word[i + 1:]
    return word[:i] + word[i] + word[i:]


def _change_case(word: str, rng: random.Random) -> str:
    options = [w for w in (word.upper(), word.lower(), word.capitalize(), word.swapcase()) if w != word]
    return rng.choice(options) if options else word


def replace_words(text: str, rate: float, rng: random.Random, edit: Callable[[str, random.Random], str]) -> str:
    """Apply ``edit`` to a fraction ``rate`` of the words of ``text``; everything else is kept."""
    words = list(WORD.finditer(text))
    picked = choose(rng, len(words), rate)
    pieces, last = [], 0
    for k in picked:
        match = words[k]
        pieces += [text[last: match.start()], edit(match.group(0), rng)]
        last = match.end()
    return "".join(pieces) + text[last:]


def _word_typo(text: str, rate: float, rng: random.Random, ctx: AttackContext) -> str:
    return replace_words(text, rate, rng, typo)


def _word_case(text: str, rate: float, rng: random.Random, ctx: AttackContext) -> str:
    return replace_words(text, rate, rng, _change_case)


# ---------------------------------------------------------------------------- character tricks
def _homoglyph(text: str, rate: float, rng: random.Random, ctx: AttackContext) -> str:
    chars = list(text)
    replaceable = [i for i, ch in enumerate(chars) if ch in LOOKALIKES]
    for k in choose(rng, len(replaceable), rate):
        i = replaceable[k]
        chars[i] = rng.choice(LOOKALIKES[chars[i]])
    return "".join(chars)


def _zero_width(text: str, rate: float, rng: random.Random, ctx: AttackContext) -> str:
    after = set(choose(rng, len(text), rate))
    return "".join(ch + (rng.choice(ZERO_WIDTH) if i in after else "") for i, ch in enumerate(text))


# ---------------------------------------------------------------------------- dilution, truncation
def _dilution(text: str, rate: float, rng: random.Random, ctx: AttackContext) -> str:
    """Human words around the text until it is a fraction 1 - rate of the words."""
    if not ctx.human_texts:
        raise ValueError("dilution needs AttackContext.human_texts")
    own = len(text.split())
    wanted = round(own * rate / (1.0 - rate))
    filler: list[str] = []
    while len(filler) < wanted:
        filler += rng.choice(list(ctx.human_texts)).split()
    filler = filler[:wanted]
    cut = rng.randint(0, len(filler))  # the pasted text lands at a random place in the human text
    return " ".join(filler[:cut] + [text] + filler[cut:])


def _truncation(text: str, rate: float, rng: random.Random, ctx: AttackContext) -> str:
    ids = ctx.encode(text)
    return ctx.decode(ids[: round((1.0 - rate) * len(ids))])


def _registry() -> dict[str, Attack]:
    from evaluation import attacks_model as model_attacks

    items = [
        Attack("token-delete", "token", per_text("token-delete", _token_delete), description="delete tokens"),
        Attack("token-insert", "token", per_text("token-insert", _token_insert),
               description="insert a random ordinary token after chosen tokens"),
        Attack("token-substitute", "token", per_text("token-substitute", _token_substitute),
               description="replace tokens by random ordinary tokens"),
        Attack("token-substitute-lm", "token", model_attacks.token_substitute_lm, needs_model=True,
               description="replace tokens by a token drawn from the model's distribution in context"),
        Attack("token-swap", "token", per_text("token-swap", _token_swap), description="swap neighbouring tokens"),
        Attack("word-lm", "word", model_attacks.word_lm, needs_model=True,
               description="replace words by a word the model proposes in context (synonym-like)"),
        Attack("word-typo", "word", per_text("word-typo", _word_typo), description="misspell words"),
        Attack("word-case", "word", per_text("word-case", _word_case), description="change the case of words"),
        Attack("homoglyph", "character", per_text("homoglyph", _homoglyph),
               description="Latin letters -> Cyrillic/Greek look-alikes"),
        Attack("zero-width", "character", per_text("zero-width", _zero_width),
               description="insert zero-width characters"),
        Attack("dilution", "dilution", per_text("dilution", _dilution), rate_below_one=True,
               description="paste into human text: watermarked fraction 1 - rate"),
        Attack("paraphrase", "paraphrase", model_attacks.paraphrase, needs_model=True,
               description="the instruct model rewrites a fraction of the sentences"),
        Attack("truncation", "truncation", per_text("truncation", _truncation), rate_below_one=True,
               description="keep the first (1 - rate) of the tokens"),
    ]
    return {a.name: a for a in items}


ATTACKS: dict[str, Attack] = _registry()
ATTACK_NAMES = tuple(ATTACKS)
FAST_ATTACKS = tuple(name for name, a in ATTACKS.items() if not a.needs_model)


def get_attack(name: str) -> Attack:
    """The attack called ``name``; ValueError listing the known names otherwise."""
    try:
        return ATTACKS[name]
    except KeyError:
        raise ValueError(f"attack: unknown {name!r} (known: {', '.join(ATTACK_NAMES)})") from None
