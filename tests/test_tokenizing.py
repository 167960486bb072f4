"""The detector's tokenizing fast paths give exactly the tokenizer's ids (detector.tokenizing)."""

from __future__ import annotations

import importlib.metadata
import random
import sysconfig
from pathlib import Path

import pytest

from detector import normalize as normalizing
from detector import tokenizing
from watermark.vocab import encode, load_vocabulary


@pytest.fixture(scope="module")
def vocab():
    return load_vocabulary()


def _lee_paragraphs(count: int) -> list[str]:
    path = importlib.metadata.distribution("gensim").locate_file("gensim/test/test_data/lee_background.cor")
    return Path(str(path)).read_text(encoding="utf-8").split("\n")[:count]


def _stdlib_sources(count: int) -> list[str]:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:count]
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def _fuzz(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = ("aé ñ\t\n\r  's1２٣中文😀\u00a0\u2003\u200b-.,!?'\"ß\u0301ﬁ\u3000\u2028Ωπя\x1f\x0b"
                "\U0001F600\U000E0041\u0378\uFFFF")
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(count)]


def test_word_cache_path_equals_the_tokenizer_on_prose_code_and_unicode(vocab):
    texts = _lee_paragraphs(120) + _stdlib_sources(40) + _fuzz(0, 1500) + [
        "<|im_start|>user\nhi<|im_end|>", "it's   ok\n\n  x", "   ", "", "a" * 500, "x\U0010FFFF y"]
    # every code point once, in runs of 64 (surrogates cannot be encoded)
    texts += ["".join(chr(c) for c in range(lo, lo + 64)) for lo in range(0x80, 0x2FA00, 64)
              if not 0xD800 <= lo < 0xE000]
    fast = 0
    for text in texts:
        ids, offsets = tokenizing.tokenize(vocab, text, with_offsets=False)
        assert offsets is None
        assert ids == encode(vocab, text), repr(text[:80])
        fast += tokenizing._WordCache.of(vocab).encode(text) is not None
    assert fast > len(texts) // 2  # the fast path is the one taken, not the fallback


def test_texts_with_added_tokens_or_unchecked_classes_take_the_tokenizers_path(vocab):
    cache = tokenizing._WordCache.of(vocab)
    assert cache.encode("say <|im_end|> now") is None  # the tokenizer splits added tokens first
    assert cache.encode("plain words") == encode(vocab, "plain words")


def test_long_pre_tokens_are_not_kept(vocab):
    cache = tokenizing._WordCache.of(vocab)
    word = "q" * (tokenizing.CACHED_WORD_CHARS + 1)
    assert cache.encode(word) == encode(vocab, word)
    assert word not in cache._words


def test_ascii_space_fold_equals_the_general_pattern():
    rng = random.Random(1)
    for _ in range(5000):
        text = "".join(rng.choice("ab  \n.\t\r\x1f\x0b") for _ in range(rng.randint(0, 30)))
        got = normalizing._fold_whitespace(text)
        edits = [(m.start(), m.end(), "\n") for m in normalizing._LINE_BREAKS.finditer(text)]
        broken = normalizing._apply_edits(text, edits)[0] if edits else text
        spaces = [(m.start(), m.end(), " ") for m in normalizing._SPACES.finditer(broken) if m.group() != " "]
        expected = normalizing._apply_edits(broken, spaces)[0] if spaces else (broken if edits else None)
        assert (None if got is None else got[0]) == expected, repr(text)


def test_detection_tokenizes_through_the_word_cache(vocab):
    # detect's ids-only path must take the cache (it was built and then never called: 3.5 -> 2 ms per
    # 1,000 tokens); a word no other test uses shows it went through
    word = " zqxwvlorptk"
    ids, offsets = tokenizing.tokenize(vocab, "a" + word + " b" * 3000, with_offsets=False)
    assert offsets is None and ids == encode(vocab, "a" + word + " b" * 3000)
    assert word in tokenizing._WordCache.of(vocab)._words


def test_ascii_pattern_splits_as_the_unicode_pattern():
    # every ASCII character is in the same class for both patterns, and random ASCII texts split alike
    for code in range(128):
        char = chr(code)
        probe = f"a{char}a 1{char}1 .{char}. {char} {char}\n{char}{char}  {char}'s{char}"
        assert tokenizing.ASCII_PATTERN.findall(probe) == tokenizing.BYTE_LEVEL_PATTERN.findall(probe), hex(code)
    rng = random.Random(2)
    alphabet = [chr(c) for c in range(128)] + list("     aaee''ssttdll")
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert tokenizing.ASCII_PATTERN.findall(text) == tokenizing.BYTE_LEVEL_PATTERN.findall(text), repr(text)


def test_a_cache_cleared_by_another_thread_mid_text_changes_nothing(vocab):
    # the shared cache is cleared when full, by whichever thread fills it: a text being tokenized at that
    # moment must still get its ids (a KeyError here was a 500 on /v1/detect)
    cache = tokenizing._WordCache(vocab.tokenizer)
    real = cache._backend

    class ClearingBackend:
        def encode(self, *args, **kwargs):
            cache._words.clear()  # what a concurrent text crossing WORD_CACHE_MAX does
            return real.encode(*args, **kwargs)

    text = "plain words " * 20 + "then kqzvtr mid text and plain words again"
    cache.encode(text)  # fills the cache
    cache._words.pop(" kqzvtr")
    cache._backend = ClearingBackend()
    assert cache.encode(text) == encode(vocab, text)
