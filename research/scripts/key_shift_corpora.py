"""Held-out collections of human text, one JSONL file each, for measuring how a fixed key's null moves per
collection (research/scripts/key_shift_collections.py; docs/research/key-shift-collections.md).

A *collection* is one body of text with a vocabulary of its own: one code base, one standard library, one
documentation set, one publication. None of them is in the shipped common-unit table's fit half
(``detector.human_corpora``: the standard library's Python, CPython's headers and the fit half of the installed
Python distributions are fitted on; the held-out distributions and everything from Debian packages here is
not). Every collection has a *kind*: ``code`` (one source file a text, its first 20,000 characters),
``documents`` (300-700 words of running text or markup) or ``paragraphs`` (40-250 words of prose).

    python research/scripts/key_shift_corpora.py [--out /work/corpora] [--max-texts 300] [--only NAME ...]

Debian packages that hold the sources (``apt-get install``): golang-1.19-src openjdk-17-source rust-src ruby3.1
erlang-src libboost1.74-dev node-lodash php-symfony-console perl-doc tcl8.6-dev linux-libc-dev debian-reference-en
debian-handbook python3.11-doc developers-reference maint-guide; Django's and SQLAlchemy's documentation from their
sdists (``pip download --no-binary :all: --no-deps django==5.1.4 sqlalchemy==2.0.36`` into OUT/sdist).
"""

from __future__ import annotations

import argparse
import hashlib
import html
import importlib.metadata
import json
import re
import subprocess
import tarfile
import zipfile
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

from detector import human_corpora

CODE_CHARS = 20_000  # of one source file, as research/scripts/fresh_keys.py's code corpus
MIN_CODE_CHARS = 1_000
DOCUMENT_WORDS = (300, 700)
PARAGRAPH_WORDS = (40, 250)


def _files(root: str | Path, patterns: tuple[str, ...], exclude: str = r"/(tests?|testdata|testing)/") -> list[Path]:
    root = Path(root)
    if not root.exists():
        return []
    skip = re.compile(exclude) if exclude else None
    found = {p for pattern in patterns for p in root.rglob(pattern) if p.is_file()}
    return sorted(p for p in found if not (skip and skip.search("/" + p.relative_to(root).as_posix())))


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def source_files(root: str, *patterns: str, exclude: str = r"/(tests?|testdata|testing)/") -> Iterator[str]:
    for path in _files(root, patterns, exclude):
        text = _read(path)
        if len(text) >= MIN_CODE_CHARS:
            yield text[:CODE_CHARS]


def python_distribution(name: str) -> Iterator[str]:
    """The Python source of one installed (held-out) distribution, tests and vendored copies left out."""
    dist = importlib.metadata.distribution(name)
    skip = re.compile(r"/_?vendor(ed)?/|/tests?/|/testing/|/test_[^/]*$|_test\.py$|_pb2(_grpc)?\.py$")
    for file in sorted(dist.files or (), key=lambda f: f.as_posix()):
        if file.suffix == ".py" and not skip.search("/" + file.as_posix()):
            text = _read(Path(str(dist.locate_file(file))))
            if len(text) >= MIN_CODE_CHARS:
                yield text[:CODE_CHARS]


def java_module(module: str) -> Iterator[str]:
    with zipfile.ZipFile("/usr/lib/jvm/java-17-openjdk-amd64/lib/src.zip") as archive:
        for name in sorted(archive.namelist()):
            if name.startswith(module + "/") and name.endswith(".java"):
                text = archive.read(name).decode("utf-8", errors="replace")
                if len(text) >= MIN_CODE_CHARS:
                    yield text[:CODE_CHARS]


class _Blocks(HTMLParser):
    """Text of an HTML page as blocks (paragraphs, list items, table cells, pre), scripts and styles dropped."""

    BLOCK = {"p", "li", "dd", "dt", "pre", "td", "th", "h1", "h2", "h3", "h4", "div", "blockquote", "title"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[str] = []
        self._parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self._skip += 1
        elif tag in self.BLOCK:
            self._flush()

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip = max(0, self._skip - 1)
        elif tag in self.BLOCK:
            self._flush()

    def handle_data(self, data):
        if not self._skip:
            self._parts.append(data)

    def _flush(self) -> None:
        text = " ".join("".join(self._parts).split())
        if text:
            self.blocks.append(text)
        self._parts = []


def html_blocks(paths: list[Path]) -> Iterator[list[str]]:
    for path in paths:
        parser = _Blocks()
        parser.feed(html.unescape(_read(path)) if path.suffix != ".gz" else "")
        parser.close()
        parser._flush()
        yield parser.blocks


def paragraphs(pages: Iterator[list[str]]) -> Iterator[str]:
    lo, hi = PARAGRAPH_WORDS
    for blocks in pages:
        for block in blocks:
            if lo <= len(block.split()) <= hi and sum(c.isalpha() for c in block) > 0.7 * len(block.replace(" ", "")):
                yield block


def documents(pages: Iterator[list[str]], sep: str = "\n\n") -> Iterator[str]:
    """Consecutive blocks of one page joined until DOCUMENT_WORDS[0] words (kept if within the upper bound)."""
    lo, hi = DOCUMENT_WORDS
    for blocks in pages:
        current: list[str] = []
        words = 0
        for block in blocks:
            current.append(block)
            words += len(block.split())
            if words >= lo:
                if words <= hi:
                    yield sep.join(current)
                current, words = [], 0


def text_files(root: str, *patterns: str) -> Iterator[list[str]]:
    """Markup files (rst, pod) as one block list per file, blocks split at blank lines."""
    for path in _files(root, patterns, exclude=r"/(releases|_build)/"):
        yield [b.strip("\n") for b in re.split(r"\n\s*\n", _read(path)) if b.strip()]


def man_pages(section: str) -> Iterator[list[str]]:
    pages = sorted(Path(f"/usr/share/man/{section}").glob("*.gz"))
    pages = sorted(pages, key=lambda p: hashlib.sha256(p.name.encode()).digest())[:600]
    for page in pages:
        shown = subprocess.run(["man", "-l", "-P", "cat", str(page)], capture_output=True, text=True, check=False,
                               env={"MANWIDTH": "80", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        yield [" ".join(b.split()) for b in re.split(r"\n\s*\n", shown.stdout) if b.strip()]


def sdist_docs(archive_glob: str, inner: str, suffix: str) -> Iterator[list[str]]:
    for archive_path in sorted(Path("/work/corpora/sdist").glob(archive_glob)):
        with tarfile.open(archive_path) as archive:
            for member in sorted(archive.getmembers(), key=lambda m: m.name):
                if inner in member.name and member.name.endswith(suffix) and "/releases/" not in member.name:
                    text = archive.extractfile(member).read().decode("utf-8", errors="replace")
                    yield [b.strip("\n") for b in re.split(r"\n\s*\n", text) if b.strip()]


def held_out_gensim(kind: str) -> Iterator[str]:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

    held = human_corpora.documents(("encyclopedia", "news"), human_corpora.HELD_OUT)
    if kind == "encyclopedia_paragraphs":
        yield from paragraphs([d.text.split("\n\n") for d in held if d.domain == "encyclopedia"])
    elif kind == "encyclopedia_documents":
        yield from documents([d.text.split("\n\n") for d in held if d.domain == "encyclopedia"])
    else:
        yield from (d.text for d in held if d.domain == "news" and len(d.text.split()) >= 150)


_PY_DOCS = "/usr/share/doc/python3.11-doc/html/_sources"
_HANDBOOK = sorted(Path("/usr/share/doc/debian-handbook/html/en-US").glob("*.html"))
_REFERENCE = sorted(Path("/usr/share/debian-reference").glob("*.en.html"))
_DEVREF = sorted(Path("/usr/share/doc/developers-reference/docs").glob("*.html"))
_SITE = "/work/main/.venv/lib/python3.11/site-packages"

# name -> (kind, language or material, texts)
COLLECTIONS = {
    # code: standard libraries, code bases and headers, several languages
    "go_std": ("code", "go", lambda: source_files("/usr/share/go-1.19/src", "*.go", exclude=r"/(cmd|testdata)/|_test\.go$")),
    "go_cmd": ("code", "go", lambda: source_files("/usr/share/go-1.19/src/cmd", "*.go", exclude=r"/testdata/|_test\.go$")),
    "java_base": ("code", "java", lambda: java_module("java.base")),
    "java_desktop": ("code", "java", lambda: java_module("java.desktop")),
    "rust_library": ("code", "rust", lambda: source_files("/usr/src/rustc-1.63.0/library", "*.rs",
                                                          exclude=r"/(tests?|benches)/")),
    "ruby_stdlib": ("code", "ruby", lambda: source_files("/usr/lib/ruby/3.1.0", "*.rb")),
    "erlang_otp": ("code", "erlang", lambda: source_files("/usr/lib/erlang/lib", "*.erl")),
    "perl_modules": ("code", "perl", lambda: source_files("/usr/share/perl/5.36.0", "*.pm")),
    "php_symfony": ("code", "php", lambda: source_files("/usr/share/php/Symfony", "*.php")),
    "js_lodash": ("code", "javascript", lambda: source_files("/usr/share/nodejs/lodash-es", "*.js")),
    "cpp_boost": ("code", "c++", lambda: source_files("/usr/include/boost", "*.hpp", exclude="/detail/")),
    "c_linux_headers": ("code", "c", lambda: source_files("/usr/include/linux", "*.h")),
    "c_glibc_headers": ("code", "c", lambda: source_files("/usr/include", "*.h", exclude=r"/(boost|linux|c\+\+|python3[^/]*|"
                                                                                        r"GL|X11|asm-generic|EGL)/")),
    "tcl_library": ("code", "tcl", lambda: source_files("/usr/share/tcltk", "*.tcl")),
    **{f"py_{name}": ("code", "python", lambda name=name: python_distribution(name))
       for name in ("sympy", "pandas", "numpy", "openai", "pip", "pygments", "fonttools", "ipython", "sqlalchemy",
                    "scipy", "transformers", "schemathesis")},
    # documents: documentation sets (markup or rendered) and running text
    "doc_python_library": ("documents", "rst", lambda: documents(text_files(f"{_PY_DOCS}/library", "*.rst.txt"))),
    "doc_python_howto": ("documents", "rst", lambda: documents(text_files(_PY_DOCS, "howto/*.rst.txt",
                                                                           "tutorial/*.rst.txt", "faq/*.rst.txt"))),
    "doc_django": ("documents", "rst", lambda: documents(sdist_docs("Django-*.tar.gz", "/docs/", ".txt"))),
    "doc_sqlalchemy": ("documents", "rst", lambda: documents(sdist_docs("sqlalchemy-*.tar.gz", "/doc/", ".rst"))),
    "doc_perl_pods": ("documents", "pod", lambda: documents(text_files("/usr/share/perl/5.36.0/pod", "*.pod"))),
    "doc_debian_handbook": ("documents", "html", lambda: documents(html_blocks(_HANDBOOK))),
    "doc_debian_reference": ("documents", "html", lambda: documents(html_blocks(_REFERENCE))),
    "doc_developers_reference": ("documents", "html", lambda: documents(html_blocks(_DEVREF))),
    "doc_man_pages": ("documents", "man", lambda: documents(man_pages("man1"))),
    "encyclopedia_documents": ("documents", "prose", lambda: held_out_gensim("encyclopedia_documents")),
    "news_articles": ("documents", "prose", lambda: held_out_gensim("news")),
    # paragraphs: prose
    "encyclopedia_paragraphs": ("paragraphs", "prose", lambda: held_out_gensim("encyclopedia_paragraphs")),
    "par_debian_handbook": ("paragraphs", "prose", lambda: paragraphs(html_blocks(_HANDBOOK))),
    "par_debian_reference": ("paragraphs", "prose", lambda: paragraphs(html_blocks(_REFERENCE))),
    "par_python_docs": ("paragraphs", "prose", lambda: paragraphs(text_files(_PY_DOCS, "*.rst.txt"))),
    "par_perl_pods": ("paragraphs", "prose", lambda: paragraphs(text_files("/usr/share/perl/5.36.0/pod", "*.pod"))),
    "par_django_docs": ("paragraphs", "prose", lambda: paragraphs(sdist_docs("Django-*.tar.gz", "/docs/", ".txt"))),
}


def sample(texts: list[str], limit: int, name: str) -> list[str]:
    """Distinct texts, at most ``limit``, in an order fixed by their hash (the same on every machine)."""
    distinct = list(dict.fromkeys(t for t in texts if t.strip()))
    distinct.sort(key=lambda t: hashlib.sha256((name + "\0" + t).encode()).digest())
    return distinct[:limit]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/work/corpora")
    parser.add_argument("--max-texts", type=int, default=300)
    parser.add_argument("--min-texts", type=int, default=100)
    parser.add_argument("--only", action="append", default=[])
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for name, (kind, material, loader) in COLLECTIONS.items():
        if args.only and name not in args.only:
            continue
        texts = sample(list(loader()), args.max_texts, name)
        if len(texts) < args.min_texts:
            print(f"{name}: {len(texts)} texts (< {args.min_texts}), skipped")
            manifest.pop(name, None)
            continue
        (out / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        manifest[name] = {"kind": kind, "material": material, "texts": len(texts),
                          "chars": sum(len(t) for t in texts)}
        print(f"{name}: {kind} ({material}), {len(texts)} texts, {manifest[name]['chars']:,} characters")
        manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
