"""Units human texts share, and why the detector does not count them.

For a fixed key every unit (``watermark.units``: a token, a pair, an n-gram) has one fixed colour.
A unit that many human texts contain (", the", "self.", "Permission is hereby granted") therefore
moves ALL their z-scores the same way: under one key the mean z of human text is shifted by about
N(0, f), where f is the mean share of texts that contain a scored unit (docs/detection.md). That is
what made one key's false-positive rate ten times another's. A unit that most texts contain anyway
is no evidence: the detector leaves out every position whose unit is in this table, as it leaves
out forced positions, and the key's null is N(0, 1) again.

The table is key-free and fixed per tokenizer: every identity whose document frequency (share of
``WINDOW_TOKENS``-token windows that contain it) reaches ``FLOOR`` in some domain, or some collection
(one package's code, the READMEs), of the fit half of ``detector.human_corpora``, with that frequency
(the largest over domains and collections; code-derived ones count ``CODE_FACTOR`` times). Each scheme leaves out
the units at or above its own threshold (``THRESHOLDS``, chosen by measurement: the smallest that
brings every key's mean z on held-out human text to the noise level, docs/detection.md).
The embedded tokenizer's table ships in ``detector/data``; another tokenizer's is built on first use
from the same corpora and cached beside the converted models.
"""

from __future__ import annotations

import hashlib
import logging
import math
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from detector import human_corpora, unit_lookup
from detector.scoring_kernel import common_frequencies
from watermark.paths import models_dir
from watermark.schemes import family_of
from watermark.units import GRAM_TAG, PAIR_TAG, TOKEN_TAG, window_identities
from watermark.vocab import load_vocabulary

log = logging.getLogger(__name__)

# A unit is left out of a text of L tokens when the share of L-token human texts containing it reaches
# the scheme's threshold (docs/detection.md, "the fix"). The table measures f, the share of 200-token
# windows; a text of L tokens contains a unit with probability about 1 - (1 - f)^(L/200), so longer
# texts leave out rarer units and shorter ones only the most common (``threshold_for_length``).
# Keyed by KGW context scheme; another family's units take the threshold of the scheme its family names
# (``SchemeFamily.common_units_as``: our sampling watermarks' unit is (h context tokens, token), as lefthash's).
THRESHOLDS = {"selfhash": 0.02, "minhash": 0.02, "lefthash": 0.01, "unigram": 0.002}
# The table keeps what the thresholds may need down to texts of ~2,000 tokens (rarer units are not kept:
# longer texts fall back to these floors): tokens from 0.0002, pairs and n-grams from 0.002.
FLOOR = {TOKEN_TAG: 0.0002, PAIR_TAG: 0.002, GRAM_TAG: 0.002}
WINDOW_TOKENS = 200
MIN_WINDOWS = 3  # an entry must be seen in at least this many windows (none from a single text)
FIT_DOMAINS = ("news", "encyclopedia", "docs", "code", "boilerplate", "packages", "readmes")
# A collection (one package's code, the READMEs) with this many windows also counts on its own: a unit that
# one code base uses everywhere moves a key's null on that code base as much as a unit every text uses.
MIN_COLLECTION_WINDOWS = 100
# Each domain's document openings (every document's first window) also count as a collection: a short
# document that many copies share (the MIT licence, a module header) is in a far larger share of
# documents than of windows, where long documents of the same domain dilute it.
OPENINGS = "#openings"
# Code bases share far more units than prose does, and much of what one shares the next shares too
# (keywords with their operands, docstring layouts): frequencies measured in code count this many times,
# i.e. code-derived units are left out at a quarter of the scheme's threshold. Measured on held-out code
# bases: the key-to-key spread of selfhash's mean z went from 0.080 to 0.056 (the noise of 339 files is
# 0.054) for 4 % fewer counted positions in documentation prose (docs/detection.md).
CODE_DOMAINS, CODE_FACTOR = ("code", "packages"), 4.0
FORMAT = 1
SHIPPED = Path(__file__).parent / "data"


@dataclass(frozen=True, slots=True)
class CommonUnits:
    """Sorted uint64 identities of units frequent in human text and their document frequencies."""

    identities: np.ndarray  # uint64, sorted
    frequencies: np.ndarray  # float32, same order
    tokenizer_fingerprint: str
    window_tokens: int
    digest: str = field(default="")  # short public name, reported with every verdict that used the table

    def __post_init__(self) -> None:
        h = hashlib.sha256(f"provmark-common-units/v{FORMAT}|{self.tokenizer_fingerprint}|{self.window_tokens}|".encode())
        h.update(np.ascontiguousarray(self.identities, dtype=np.uint64).tobytes())
        h.update(np.ascontiguousarray(self.frequencies, dtype=np.float32).tobytes())
        object.__setattr__(self, "digest", h.hexdigest()[:16])

    def __len__(self) -> int:
        return int(self.identities.shape[0])

    def frequency_of(self, ids: np.ndarray) -> np.ndarray:
        """The window frequency of each identity (0 for identities not in the table), from the table's
        open-addressing hash tables (``detector.unit_lookup``): the packed one searched by the C scoring kernel
        where it is built (``detector.scoring_kernel.common_frequencies``, one prefetched pass), else numpy's."""
        ids = np.ascontiguousarray(ids, dtype=np.uint64)
        if ids.shape[0]:
            found = common_frequencies(ids, *unit_lookup.packed_hash_table(self))
            if found is not None:
                return found
        return unit_lookup.frequencies(self, ids)

    def excluded(self, watermark, token_ids, identities: np.ndarray | None = None) -> np.ndarray:
        """Indices of the scored positions of ``token_ids`` whose unit this table leaves out under
        ``watermark``: kgw, gumbel and synthid specs. hf: and vllm: specs count every position, as the
        detectors they reproduce do. ``identities``: the positions' unit identities when the caller has
        them already (a sampling watermark's caller must give them: ``watermark.units.identities``)."""
        spec = watermark.spec
        threshold = threshold_of(spec)
        if threshold is None:
            return np.zeros(0, dtype=np.int64)
        if identities is None:
            identities = watermark.unit_identities(token_ids)
        threshold = threshold_for_length(threshold, len(token_ids), self.window_tokens)
        return np.flatnonzero(self.frequency_of(identities) >= threshold)

    def lookup_table(self, watermark, num_tokens: int):
        """What ``excluded`` searches, for a caller that searches it itself (``detector.scoring_kernel``): (packed
        slots (``detector.unit_lookup.packed_hash_table``), longest probe, the float32 threshold a frequency must reach) for a text
        of ``num_tokens`` tokens under ``watermark``'s spec; None where the spec counts every position."""
        spec = watermark.spec
        threshold = threshold_of(spec)
        if threshold is None:
            return None
        slots, probes = unit_lookup.packed_hash_table(self)
        # excluded compares float32 frequencies with a Python float, which NumPy does in float32
        return slots, probes, np.float32(threshold_for_length(threshold, num_tokens, self.window_tokens))

    # ------------------------------------------------------------------------------ storage
    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, identities=self.identities, frequencies=self.frequencies, format=FORMAT,
                                tokenizer_fingerprint=self.tokenizer_fingerprint, window_tokens=self.window_tokens)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> CommonUnits:
        with np.load(path, allow_pickle=False) as data:
            if int(data["format"]) != FORMAT:
                raise ValueError(f"{path}: common-unit table format {int(data['format'])}, expected {FORMAT}")
            return cls(np.asarray(data["identities"], dtype=np.uint64), np.asarray(data["frequencies"], dtype=np.float32),
                       str(data["tokenizer_fingerprint"]), int(data["window_tokens"]))


def threshold_for_length(threshold: float, num_tokens: int, window_tokens: int = WINDOW_TOKENS) -> float:
    """The window frequency f at which a unit is in ``threshold`` of the human texts of ``num_tokens``
    tokens: 1 - (1 - threshold)^(window / L) (``threshold`` itself at L = window)."""
    return -math.expm1(math.log1p(-threshold) * window_tokens / max(1, num_tokens))


def file_name(tokenizer_fingerprint: str) -> str:
    return f"common-units-{tokenizer_fingerprint[:16]}.npz"


def build(vocab, window_tokens: int = WINDOW_TOKENS, progress: bool = False) -> CommonUnits:
    """Count, per fit domain and per collection of at least MIN_COLLECTION_WINDOWS windows, the share
    of ``window_tokens``-token windows that contain each identity; keep those at FLOOR or more in some
    domain or collection (and in at least MIN_WINDOWS windows of it), with the largest share."""
    docs = human_corpora.documents(FIT_DOMAINS, human_corpora.FIT)
    if not docs:
        raise RuntimeError("no human corpus is installed to build a common-unit table from (pip install gensim)")
    encoded = vocab.tokenizer.backend_tokenizer.encode_batch_fast([d.text for d in docs], add_special_tokens=False)
    items = zip(docs, encoded)
    if progress:
        items = tqdm(items, total=len(docs), desc="common units", unit="doc")
    domain_of: dict[str, str] = {}  # each domain and collection -> its domain
    grouped = []
    for doc, enc in items:
        groups = (doc.domain,) if doc.collection == doc.domain else (doc.domain, doc.collection)
        for group in groups + (doc.domain + OPENINGS,):
            domain_of[group] = doc.domain
        grouped.append((enc.ids, groups, (doc.domain + OPENINGS,)))
    per_group, windows = _window_counts(grouped, window_tokens)
    weights = {group: CODE_FACTOR if domain_of[group] in CODE_DOMAINS else 1.0 for group in per_group
               if group in FIT_DOMAINS or windows[group] >= MIN_COLLECTION_WINDOWS}
    return _table(per_group, windows, weights, vocab.fingerprint, window_tokens)


def from_texts(vocab, texts: list[str], window_tokens: int = WINDOW_TOKENS) -> CommonUnits:
    """The table of ONE collection of texts (a deployment's own, ``detector.your_units``): the share of its
    ``window_tokens``-token windows, and of its texts' openings, that contain each identity, counted as
    ``build`` counts a collection of the shipped corpora (at FLOOR or more, in at least MIN_WINDOWS windows)."""
    return from_collections(vocab, [texts], window_tokens)


def from_collections(vocab, collections: list[list[str]], window_tokens: int = WINDOW_TOKENS) -> CommonUnits:
    """``from_texts`` of all the texts and, where there are several collections (``keys calibrate --corpus docs
    --corpus src``), of each on its own too, each identity at its largest share: what one collection shares is
    diluted by the others' windows (a documentation set's markup among a code base's thousands), so each is
    counted on its own, as ``build`` counts each collection of the shipped corpora."""
    several = len(collections) > 1
    items = []
    for index, texts in enumerate(collections):
        encoded = vocab.tokenizer.backend_tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        own = (f"texts/{index}",) if several else ()
        items += [(enc.ids, ("texts",) + own, ("texts" + OPENINGS,) + tuple(group + OPENINGS for group in own))
                  for enc in encoded]
    per_group, windows = _window_counts(items, window_tokens, least=1)  # a short text is a text of the collection
    return _table(per_group, windows, dict.fromkeys(per_group, 1.0), vocab.fingerprint, window_tokens)


def _window_counts(items, window_tokens: int, least: int = 20) -> tuple[dict[str, dict[int, list[np.ndarray]]],
                                                                      dict[str, int]]:
    """``items``: (token ids, groups, openings groups) per document. Each document is cut into windows of
    ``window_tokens`` (the last one takes the tail, up to 1.5 windows long; windows under ``least`` tokens are
    skipped); every window counts in each of its groups, the first also in the openings groups. Returns
    ({group: {tag: [identities of each window]}}, {group: windows})."""
    per_group: dict[str, dict[int, list[np.ndarray]]] = {}
    windows: dict[str, int] = {}
    for token_ids, groups, openings in items:
        ids = np.asarray(token_ids, dtype=np.int64)
        starts = range(0, max(1, ids.shape[0] - window_tokens // 2), window_tokens)
        for start in starts:
            window = ids[start:start + window_tokens] if start != starts[-1] else ids[start:]
            if window.shape[0] < least:
                continue
            found_here = window_identities(window)
            for group in groups + (openings if start == 0 else ()):  # the share of documents, not of windows
                windows[group] = windows.get(group, 0) + 1
                for tag, found in found_here.items():
                    per_group.setdefault(group, {}).setdefault(tag, []).append(found)
    return per_group, windows


def _table(per_group: dict, windows: dict[str, int], weights: dict[str, float], tokenizer_fingerprint: str,
           window_tokens: int) -> CommonUnits:
    """The identities at FLOOR or more (times the group's weight) in some group of ``weights``, seen in at least
    MIN_WINDOWS of its windows, each with its largest frequency."""
    kept_ids, kept_freq = [np.zeros(0, dtype=np.uint64)], [np.zeros(0, dtype=np.float32)]
    for group, weight in weights.items():
        for tag, parts in per_group[group].items():
            found, counts = np.unique(np.concatenate(parts), return_counts=True)
            freq = np.minimum(1.0, counts / windows[group] * weight)
            keep = (counts >= MIN_WINDOWS) & (freq >= FLOOR[tag])
            kept_ids.append(found[keep].astype(np.uint64))
            kept_freq.append(freq[keep].astype(np.float32))
    return _largest(np.concatenate(kept_ids), np.concatenate(kept_freq), tokenizer_fingerprint, window_tokens)


def _largest(ids: np.ndarray, freq: np.ndarray, tokenizer_fingerprint: str, window_tokens: int) -> CommonUnits:
    """One entry per identity, with its largest frequency, sorted by identity."""
    order = np.lexsort((-freq, ids))  # by identity, the largest frequency first
    ids, freq = ids[order], freq[order]
    first = np.ones(ids.shape[0], dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    return CommonUnits(ids[first].astype(np.uint64), freq[first].astype(np.float32), tokenizer_fingerprint,
                       int(window_tokens))


_merged: dict[tuple[str, str], CommonUnits] = {}


def merged(base: CommonUnits, extra: CommonUnits) -> CommonUnits:
    """``base`` and ``extra`` (same tokenizer and windows) as one table, each identity at its larger frequency:
    a unit common in either is left out. Built once per pair."""
    if (base.tokenizer_fingerprint, base.window_tokens) != (extra.tokenizer_fingerprint, extra.window_tokens):
        raise ValueError("common-unit tables of different tokenizers or windows cannot be merged")
    found = _merged.get((base.digest, extra.digest))
    if found is None:
        found = _largest(np.concatenate([base.identities, extra.identities]),
                         np.concatenate([base.frequencies, extra.frequencies]),
                         base.tokenizer_fingerprint, base.window_tokens)
        if found.digest == base.digest:  # the extra table adds nothing: the base itself (and its hash tables)
            found = base
        if len(_merged) >= 4:  # a deployment has one table of its own per tokenizer; replaced ones go, with
            for (base_digest, _), table in _merged.items():  # their hash tables (tens of MB each)
                if table.digest != base_digest:
                    unit_lookup.forget(table.digest)
            _merged.clear()
        _merged[(base.digest, extra.digest)] = found
    return found


_loaded: dict[str, CommonUnits] = {}
_lock = threading.Lock()


def for_vocabulary(vocab) -> CommonUnits:
    """The table of ``vocab``'s tokenizer: shipped, cached, or built now (once) and cached."""
    fingerprint = vocab.fingerprint
    found = _loaded.get(fingerprint)
    if found is not None:
        return found
    with _lock:
        found = _loaded.get(fingerprint)
        if found is None:
            found = _loaded[fingerprint] = _load_or_build(vocab)
    return found


def threshold_of(spec) -> float | None:
    """The share of human texts at which a unit of ``spec`` is left out (None: the spec's family counts every
    position, as the reference detector it reproduces does: hf:, hf:synthid, vllm:gumbel)."""
    scheme = family_of(spec).common_units_as(spec)
    return None if scheme is None else THRESHOLDS.get(scheme)


def uses_table(spec) -> bool:
    """Whether ``spec`` is scored with the table (its family leaves common units out)."""
    return family_of(spec).common_units_as(spec) is not None


def for_spec(spec, vocab) -> CommonUnits | None:
    """The table the detector scores ``spec`` with (``for_vocabulary``), or None for a family that counts every
    position as the reference detector it reproduces does."""
    return for_vocabulary(vocab) if uses_table(spec) else None


def current_digests(yours=None) -> set[str]:
    """The digest of the table each tokenizer that has one here is scored with (looked up in
    ``for_vocabulary``'s order: shipped, then built), read without loading a tokenizer. ``yours``: a
    ``detector.your_units.YourUnits`` store; a tokenizer with a table of the deployment's own texts is scored
    with the two merged (``merged``), whose digest is the current one."""
    found: dict[str, CommonUnits] = {}
    for folder in (SHIPPED, models_dir() / "common-units"):
        for path in sorted(folder.glob("common-units-*.npz")) if folder.is_dir() else ():
            if path.name not in found:
                try:
                    found[path.name] = CommonUnits.load(path)
                except (OSError, ValueError, KeyError):
                    continue
    records = yours.records() if yours is not None else {}
    return {(merged(table, yours.table(table.tokenizer_fingerprint)) if table.tokenizer_fingerprint in records
             else table).digest for table in found.values()}


def _load_or_build(vocab) -> CommonUnits:
    name = file_name(vocab.fingerprint)
    for path in (SHIPPED / name, models_dir() / "common-units" / name):
        if path.is_file():
            table = CommonUnits.load(path)
            if table.tokenizer_fingerprint == vocab.fingerprint:
                return table
    log.warning("no common-unit table for tokenizer %s yet: building one from the installed human corpora",
                vocab.fingerprint[:16])
    table = build(vocab)
    table.save(models_dir() / "common-units" / name)
    return table


def main(argv: list[str] | None = None) -> int:
    """``python -m detector.common_units [OUT_DIR]``: (re)build the embedded tokenizer's table."""
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else SHIPPED
    vocab = load_vocabulary()
    table = build(vocab, progress=True)
    path = out / file_name(vocab.fingerprint)
    table.save(path)
    print(f"{path}: {len(table)} units, digest {table.digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
