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
``evaluation.attacks_model`` and need ``AttackContext.lm`` / ``.engine``; what every attack is called
with and how it is seeded is ``evaluation.attack_context``.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from detector.normalize import HOMOGLYPHS
from evaluation import attacks_model as model_attacks
from evaluation.attack_context import WORD, Attack, AttackContext, choose, per_text

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
