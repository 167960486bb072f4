"""Human-written text that ships inside installed packages, by domain, split into fit and held-out halves.

A per-key promise ("a human text is flagged with probability at most alpha") has to be measured on
human text, and whatever is fitted on text (the common-unit table, a key's calibration) must be
checked on text it never saw. Every source here is a file inside an installed distribution, read as
a file (nothing is imported, nothing is downloaded), and every document goes to exactly one half by
a hash of its name, so the split is the same on every machine:

* ``news``        gensim's Lee corpus: ``lee_background.cor`` (299 ABC news articles) and ``lee.cor``;
* ``encyclopedia`` the Wikipedia articles of gensim's ``enwiki-...-shortened.xml.bz2``, markup removed;
* ``reviews``     gensim's ``pang_lee_polarity.cor`` (lower-cased film reviews, tokenised by spaces);
* ``docs``        the Python documentation's prose (``pydoc_data/topics.py`` of the standard library);
* ``code``        the standard library's own Python source, and CPython's C headers;
* ``boilerplate`` licence texts of the installed distributions (MIT, BSD, Apache ... over and over);
* ``packages``    the Python source of every installed third-party distribution (up to
                  ``PACKAGE_CHARS`` of it each): code bases with identifiers and docstring styles of their own;
* ``readmes``     the long descriptions (READMEs: markdown or reStructuredText prose, badges, install lines)
                  of the installed distributions.

Documents also name their *collection*, the body of text they were written in (one package's code, the
READMEs, the Lee corpus): units a collection shares are what moves a fixed key's null on text from it
(docs/detection.md), so the common-unit table counts frequencies per collection as well as per domain.
A third-party package goes to one half whole (the split hashes its name), so the held-out half holds
code bases nothing was fitted on.
"""

from __future__ import annotations

import ast
import bz2
import hashlib
import html
import importlib.metadata
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

FIT, HELD_OUT = "fit", "held_out"
DOMAINS = ("news", "encyclopedia", "reviews", "docs", "code", "boilerplate", "packages", "readmes")
GENSIM_DATA = "gensim/test/test_data"
MAX_DOC_CHARS = 60_000  # a longer source file is cut: long enough for 5,000-token texts
PACKAGE_CHARS = 250_000  # of one distribution's source at most (~70k tokens): no code base outweighs the rest


@dataclass(frozen=True, slots=True)
class HumanDoc:
    domain: str
    source: str  # where it came from: "<distribution>:<path>[#part]"
    text: str
    collection: str = ""  # the body of text it belongs to ("pkg:numpy", "stdlib", "lee"); "" = its domain
    whole: bool = False  # the collection goes to one split whole (a code base), not document by document

    @property
    def split(self) -> str:
        """FIT or HELD_OUT, by a hash of the source name, or of the collection for a whole one (stable
        across machines)."""
        name = self.collection if self.whole else self.source
        return FIT if hashlib.sha256(name.encode()).digest()[0] % 2 == 0 else HELD_OUT


def documents(domains: tuple[str, ...] = DOMAINS, split: str | None = None) -> list[HumanDoc]:
    """Every document of the given domains (one split, or both with ``split=None``), in a fixed order.

    Sources that are not installed are skipped."""
    unknown = set(domains) - set(DOMAINS)
    if unknown:
        raise ValueError(f"domains: unknown {sorted(unknown)}; known: {', '.join(DOMAINS)}")
    if split not in (None, FIT, HELD_OUT):
        raise ValueError(f"split: expected {FIT!r}, {HELD_OUT!r} or None, got {split!r}")
    out = [d for domain in domains for d in _domain(domain)]
    return [d for d in out if split is None or d.split == split]


def held_out_texts(vocab) -> dict[str, list]:
    """The held-out half as independent token-id texts in three shapes users have (numpy int64 arrays):
    encyclopedia paragraphs (first 200 tokens, at least 50), documents (news, encyclopedia,
    documentation; first 800 tokens, at least 150) and source files (first 1,500 tokens, at least 300).
    ``code_bases`` is ``package_code`` with at most 8 files of each distribution: units shared across code
    bases, where one code base's own (a licence header in every file) does not outweigh the rest."""
    held = documents(split=HELD_OUT)
    return {
        "paragraphs": _encoded(vocab, [p for d in held if d.domain == "encyclopedia" for p in d.text.split("\n\n")],
                               200, 50),
        "documents": _encoded(vocab, [d.text for d in held if d.domain in ("news", "encyclopedia", "docs")], 800, 150),
        "code": _encoded(vocab, [d.text for d in held if d.domain == "code"], 1500, 300),
        "package_code": _encoded(vocab, [d.text for d in held if d.domain == "packages"], 1500, 300),
        "code_bases": _encoded(vocab, _per_collection([d for d in held if d.domain == "packages"], 8), 1500, 300),
        "readmes": _encoded(vocab, [d.text for d in held if d.domain == "readmes"], 1500, 150),
    }


def held_out_long_texts(vocab) -> dict[str, list]:
    """The held-out documents of at least 2,000 tokens, first 5,000 tokens (the longest texts the detector's
    promise covers): prose (news, encyclopedia, documentation, reviews) and source files (standard library
    and third-party packages). Few prose documents are that long (about 40), so their means are noisy."""
    held = documents(split=HELD_OUT)
    prose = [d.text for d in held if d.domain in ("news", "encyclopedia", "docs", "reviews")]
    return {"long_prose": _encoded(vocab, prose, 5000, 2000),
            "long_code": _encoded(vocab, [d.text for d in held if d.domain in ("code", "packages")], 5000, 2000)}


def _per_collection(docs: list[HumanDoc], most: int) -> list[str]:
    """The texts of ``docs`` in their order, at most ``most`` of each collection."""
    taken: dict[str, int] = {}
    out = []
    for doc in docs:
        if taken.get(doc.collection, 0) < most:
            taken[doc.collection] = taken.get(doc.collection, 0) + 1
            out.append(doc.text)
    return out


def _encoded(vocab, texts: list[str], keep: int, least: int) -> list:
    """The first ``keep`` token ids (numpy int64) of each text that has at least ``least``."""
    encoded = vocab.tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    return [np.asarray(e.ids[:keep], dtype=np.int64) for e in encoded if len(e.ids) >= least]


@lru_cache(maxsize=None)
def _domain(domain: str) -> tuple[HumanDoc, ...]:
    loader = {"news": _news, "encyclopedia": _encyclopedia, "reviews": _reviews, "docs": _python_docs,
              "code": _code, "boilerplate": _licences, "packages": _package_code, "readmes": _readmes}[domain]
    return tuple(HumanDoc(domain, source, text[:MAX_DOC_CHARS], collection or domain, whole)
                 for source, text, collection, whole in map(_with_collection, loader()) if text.strip())


def _with_collection(item: tuple) -> tuple[str, str, str, bool]:
    """(source, text) -> (source, text, collection, whole); a loader may name the collection itself."""
    return item if len(item) == 4 else (*item, "", False)


# ------------------------------------------------------------------------------------- sources
def _distribution_file(distribution: str, path: str) -> Path | None:
    try:
        found = Path(str(importlib.metadata.distribution(distribution).locate_file(path)))
    except importlib.metadata.PackageNotFoundError:
        return None
    return found if found.is_file() else None


def _news() -> Iterator[tuple[str, str]]:
    for name in ("lee_background.cor", "lee.cor"):
        path = _distribution_file("gensim", f"{GENSIM_DATA}/{name}")
        if path is None:
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines()):
            if line.strip():
                yield f"gensim:{name}#{i}", " ".join(line.split())


def _reviews() -> Iterator[tuple[str, str]]:
    path = _distribution_file("gensim", f"{GENSIM_DATA}/pang_lee_polarity.cor")
    if path is None:
        return
    for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines()):
        text = _FASTTEXT_LABEL.sub("", " ".join(line.split()))  # "__label__neg ...": the file's label, not the review
        if text:
            yield f"gensim:pang_lee_polarity.cor#{i}", text


_FASTTEXT_LABEL = re.compile(r"^(?:__label__\S+\s*)+")


_WIKI_PAGE = re.compile(r"<page>.*?<title>(.*?)</title>.*?<text[^>]*>(.*?)</text>", re.S)


def _encyclopedia() -> Iterator[tuple[str, str]]:
    path = _distribution_file("gensim", f"{GENSIM_DATA}/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
    if path is None:
        return
    raw = bz2.decompress(path.read_bytes()).decode("utf-8", errors="replace")
    for title, body in _WIKI_PAGE.findall(raw):
        text = wiki_to_text(html.unescape(body))
        if len(text) >= 500:  # redirects and stubs are not articles
            yield f"gensim:enwiki#{title}", text


_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")
_TABLE = re.compile(r"\{\|.*?\|\}", re.S)
_REF = re.compile(r"<ref[^>/]*/>|<ref[^>]*>.*?</ref>", re.S)
_TAG = re.compile(r"<[^>]+>")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_FILE_LINK = re.compile(r"\[\[(?:File|Image|Category):[^\[\]]*(?:\[\[[^\]]*\]\][^\[\]]*)*\]\]", re.I)
_LINK = re.compile(r"\[\[(?:[^|\]]*\|)?([^\]]*)\]\]")
_EXTERNAL = re.compile(r"\[https?://\S+\s?([^\]]*)\]")


def wiki_to_text(markup: str) -> str:
    """Plain paragraphs from MediaWiki markup: templates, tables, references, files and tags removed,
    links replaced by their text, headings and list lines dropped."""
    text = _COMMENT.sub("", markup)
    text = _REF.sub("", text)
    for _ in range(6):  # templates nest
        text, count = _TEMPLATE.subn("", text)
        if not count:
            break
    text = _TABLE.sub("", text)
    text = _FILE_LINK.sub("", text)
    text = _LINK.sub(r"\1", text)
    text = _EXTERNAL.sub(r"\1", text)
    text = _TAG.sub("", text).replace("'''", "").replace("''", "")
    paragraphs = []
    for line in text.splitlines():
        line = " ".join(line.split())
        if len(line) < 80 or line[0] in "=*#:;|!{}" or line.startswith("}}"):
            continue
        paragraphs.append(line)
    return "\n\n".join(paragraphs)


def _python_docs() -> Iterator[tuple[str, str]]:
    path = Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py"
    if not path.is_file():
        return
    for node in ast.parse(path.read_text(encoding="utf-8")).body:  # one assignment of a dict literal
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "topics" for t in node.targets):
            for name, body in sorted(ast.literal_eval(node.value).items()):
                yield f"stdlib:pydoc_data/topics.py#{name}", body


def _code() -> Iterator[tuple[str, str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "idlelib", "lib2to3", "site-packages", "pydoc_data", "encodings", "__pycache__")
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if rel.parts[0] in skip or path.stat().st_size < 1_000:
            continue
        yield f"stdlib:{rel.as_posix()}", path.read_text(encoding="utf-8", errors="replace"), "stdlib", False
    include = Path(sysconfig.get_paths()["include"])
    for path in sorted(include.rglob("*.h")):
        if path.stat().st_size >= 1_000:
            text = path.read_text(encoding="utf-8", errors="replace")
            yield f"include:{path.relative_to(include).as_posix()}", text, "include", False


_GENERATED = re.compile(r"_pb2(_grpc)?\.py$|/_?vendor(ed)?/|/tests?/|/testing/|/test_[^/]*$|_test\.py$")


def _package_code() -> Iterator[tuple[str, str, str, bool]]:
    """Each installed third-party distribution's Python source (tests, vendored copies and generated
    protobuf modules left out), files in a fixed hash order up to PACKAGE_CHARS; a file shipped by two
    distributions counts once."""
    seen: set[bytes] = set()
    for dist in sorted(importlib.metadata.distributions(), key=lambda d: (d.metadata["Name"] or "").lower()):
        name = (dist.metadata["Name"] or "").lower()
        if name == "provmark":  # our own code is not the human text we measure against
            continue
        files = [f for f in dist.files or () if f.suffix == ".py" and not _GENERATED.search("/" + f.as_posix())]
        files.sort(key=lambda f: hashlib.sha256(f.as_posix().encode()).digest())
        budget = PACKAGE_CHARS
        for file in files:
            if budget <= 0:
                break
            try:
                text = Path(str(dist.locate_file(file))).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            digest = hashlib.sha256(text.encode()).digest()
            if len(text) < 1_000 or digest in seen:
                continue
            seen.add(digest)
            text = text[:min(budget, MAX_DOC_CHARS)]
            budget -= len(text)
            yield f"{name}:{file.as_posix()}", text, f"pkg:{name}", True


def _readmes() -> Iterator[tuple[str, str, str, bool]]:
    """The long description (README) in each installed distribution's metadata, when it says something."""
    for dist in sorted(importlib.metadata.distributions(), key=lambda d: (d.metadata["Name"] or "").lower()):
        body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        if len(body) >= 1_000:
            yield f"{(dist.metadata['Name'] or '').lower()}:METADATA", body, "readmes", False


def _licences() -> Iterator[tuple[str, str]]:
    seen = set()
    for dist in sorted(importlib.metadata.distributions(), key=lambda d: (d.metadata["Name"] or "").lower()):
        name = (dist.metadata["Name"] or "").lower()
        for file in dist.files or ():
            stem = file.name.upper()
            if not (stem.startswith(("LICENSE", "LICENCE", "COPYING", "NOTICE"))):
                continue
            key = (name, str(file))
            if key in seen:
                continue
            seen.add(key)
            try:
                text = Path(str(dist.locate_file(file))).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            yield f"{name}:{file}", text
