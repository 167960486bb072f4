"""The detector's Python API: ``Detector(vocab, keyring).detect(text, ...) -> Verdict``.

text -> normalise (offsets kept) -> tokenize (``add_special_tokens=False``) -> the keys under test and their
calibrations -> a ``ScoringRequest`` scored by ``detector.kgw_verdict`` (green flags, dedup, G of T, z, exact p,
Holm across keys; optionally the best window and a per-token explanation, with offsets into the ORIGINAL text)
or ``detector.sampling_verdict`` -> for a service that keeps its own output, the own-output match and, on a
positive verdict, the spoof check.

Loads a tokenizer, never model weights (this package does not import ``generation``).
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Iterable

import torch

from db.output_grams import Match, gram_key
from detector import common_units
from detector.calibration import Calibration, CalibrationStore
from detector.key_source import HoldsPublishedHalves, KeySource, has_master_key
from detector.kgw_verdict import score_kgw
from detector.normalize import normalize as normalize_text
from detector.paraphrase_match import ParaphraseMatcher
from detector.sampling_verdict import score_sampling
from detector.scoring import INSUFFICIENT_TEXT, NOT_WATERMARKED, WATERMARKED
from detector.scoring_request import DetectOptions, ScoringRequest, current_calibrations
from detector.spoof_check import has_check, scored_units, verdict_spoof_check
from detector.tokenizing import tokenize
from detector.verdict import Verdict
from detector.your_units import YourUnits, scoring_table
from watermark.field_error import FieldError
from watermark.key_binding import keys_bound_to, require_bound, shared_spec
from watermark.key_info import KeyNotFoundError
from watermark.keys import Keyring
from watermark.scheme import Watermark, make_watermark
from watermark.specs import AnySpec, is_sampling, parse_spec
from watermark.vocab import Vocabulary, load_vocabulary

VERDICTS = (WATERMARKED, NOT_WATERMARKED, INSUFFICIENT_TEXT)
PUBLIC_DITHER_KEY = b"provmark/detect-dither/public-hf-specs"
DITHER_PURPOSE = b"provmark/detect-dither"
MAX_PUBLIC_SPECS = 64  # spec texts from requests whose watermark or bound keys a detector keeps (_cached)


def dither_key_of(keyring: KeySource) -> bytes | None:
    """The detect-scope dither's key, derived from the keyring's master key (every worker of both services, and
    batch workers shipped it, draw the same u for a text); None for a keyring stand-in without a master key."""
    return keyring.derive_key(DITHER_PURPOSE) if has_master_key(keyring) else None


class Detector:
    """Scores text against the keyring's detection keys (or given keys) or a public hf spec.

    ``vocab``: the tokenizer the scheme is defined over (default: the embedded model's, loaded on
    first use). ``keyring``: where kgw secrets come from (default: ``Keyring()`` of PROVMARK_HOME).
    Secrets and green tables are cached per process and dropped when the keyring file changes.
    ``bind_keys``: score each key only under its own spec (``watermark.key_binding``); only a caller that
    holds the secrets anyway (the evaluation harness, measuring every scheme with one key) turns it off.
    ``output_memory``: this process's copy of the service's record of its own output
    (``db.output_memory.MemoryMirror``); with it, a kgw:, gumbel: or synthid: verdict that says
    ``watermarked`` carries the spoof check (``detector.spoof_check``). ``semantic_memory``: this process's copy of
    the service's outputs' meaning (``db.semantic_memory.SignatureMirror``); with it, a keyed verdict carries
    ``paraphrase_of_own_output`` (``detector.paraphrase_match``)."""

    def __init__(self, vocab: Vocabulary | None = None, keyring: KeySource | None = None, calibrations=None,
                 bind_keys: bool = True, output_memory=None, dither_key: bytes | None = None,
                 your_units=None, semantic_memory=None) -> None:
        """``dither_key``: the detect-scope dither's key when the keyring cannot derive it (a batch worker is
        shipped the service's, ``dither_key_of``); by default derived from the keyring's master key.
        ``your_units``: the table of the deployment's own texts' common units when the keyring cannot verify it
        (a batch worker is shipped the service's, ``detector.your_units``); by default read from the keyring's
        home, and none for a keyring stand-in without a master key."""
        self._vocab = vocab
        self.output_memory = output_memory
        self.paraphrases = None if semantic_memory is None else ParaphraseMatcher(semantic_memory, lambda: self.keyring)
        self._bind_keys = bind_keys
        self._dither_key: bytes | None = dither_key
        self._gram_key: int | None = None  # db.output_grams: keys the n-grams of remembered outputs
        self._keyring = keyring
        self._lock = threading.Lock()
        self._stamp: tuple | None = None
        self._watermarks: dict[tuple[str, str | None], Watermark] = {}
        self._detection_infos: list | None = None  # KeyInfo (or a stand-in's) of the detection keys
        self._all_infos: dict | None = None  # key id -> KeyInfo, for keys named by the caller
        self._bound_infos: dict[str, list] = {}  # spec text -> the detection keys bound to it (keys_bound_to)
        self._keyring_file: str | None = None  # the keyring's path, stat-ed on every detection
        # key_id, spec fingerprint -> Calibration | None (default: the keyring home's CalibrationStore)
        self._calibrations = calibrations
        self._your_units = your_units  # CommonUnits (shipped to a worker), a YourUnits store, or None: not yet

    def __repr__(self) -> str:
        model = self._vocab.model_id if self._vocab is not None else "default (not loaded)"
        return f"Detector(model={model!r}, keyring={self._keyring!r})"

    @property
    def vocab(self) -> Vocabulary:
        if self._vocab is None:
            self._vocab = load_vocabulary()
        return self._vocab

    @property
    def keyring(self) -> KeySource:
        if self._keyring is None:
            self._keyring = Keyring()
        return self._keyring

    # ------------------------------------------------------------------------------- detect
    def detect(self, text: str, *, keys: Iterable[str] | None = None, spec: str | AnySpec | None = None,
               options: DetectOptions = DetectOptions()) -> Verdict:
        """Score ``text`` under ``options`` (``DetectOptions``); see the module docstring. Raises SpecError (bad spec), KeyNotFoundError
        (unknown key, or no detection key for a kgw spec), ValueError (bad option or text).

        ``keys=None`` tests every detection key of the keyring bound to ``spec``; an hf spec (``hf:``,
        ``hf:synthid``) is public and takes none. Sampling specs (``gumbel:``, ``synthid:``, ``hf:synthid``,
        ``vllm:gumbel``) are scored by ``detector.sampling_verdict``, the others by green flags.
        The verdict is ``watermarked`` when the Holm-corrected exact p-value is at most alpha
        (``fpr``, or the normal tail of ``z_threshold``); with ``windows`` the text and the window
        family each get half of alpha. ``explain`` adds per-token green/red flags with offsets:
        it reveals part of the green lists, so serve it only to trusted callers.

        ``forced_positions``: token indices (of this text's tokenization) where the generator had
        fewer than two allowed tokens (``RequestOutput.forced_positions`` of a constrained
        generation, when the text is exactly its output): they are left out of T and G, so a fully
        constrained text is ``insufficient_text`` rather than judged on coins the key never tossed."""
        if not isinstance(text, str):
            raise FieldError("text", f"expected a string, got {type(text).__name__}")
        spec = parse_spec(self.own_spec(keys) if spec is None and keys is not None else spec)
        options = options.scoring()
        marks = self.watermarks(spec, keys)
        normalized = normalize_text(text, options.normalize)
        vocab = self.vocab
        ids_list, offsets = tokenize(vocab, normalized.text, with_offsets=options.windows or options.explain)
        ids = torch.tensor(ids_list, dtype=torch.int64)
        # hf colours are public (no secret): their dither needs no secret either, nor a master key to exist
        dither_key = self.dither_key if spec.needs_key else PUBLIC_DITHER_KEY
        store = self._calibration_store() if spec.needs_key else None  # hf specs: no keyring, no master key
        if isinstance(store, CalibrationStore):
            store.refresh()  # the verdict's one look at the calibration file (its tables' records too)
        # our keyed specs leave out units common in human text (and in the deployment's own texts); hf:,
        # hf:synthid and vllm:gumbel count every position (the table says so per kind), as their reference
        # detectors do
        common = self.common_units_for(spec, fresh=False)
        checked = self.output_memory is not None and spec.needs_key and has_check(spec)
        sampling = is_sampling(spec)
        # the own-output match runs inside the kgw scoring kernel's call (no crossing into C of its own)
        matches = self._match_requests(marks) if checked and not sampling else None
        request = ScoringRequest(
            text=text, normalized=normalized, ids=ids, offsets=offsets, marks=marks, spec=spec, vocab=vocab,
            options=options, calibrations=current_calibrations(self.calibrations_for(marks, fresh=False), common),
            common=common, dither_key=dither_key, keep_spoof_units=checked, matches=matches)
        scored = score_sampling(request) if sampling else score_kgw(request)
        verdict = scored.verdict
        if checked:
            # every verdict: a scrubbed output is a text the z-test let go; the counts, the null and the n-gram
            # index are this process's copy of the memory (db.output_memory.MemoryMirror), not a query
            match = self._own_output(ids, marks, matches)
            verdict.own_output = None if match is None else match[1].to_dict()
            # only positives: a spoof is a text the detector accepted (human text costs nothing)
            if verdict.watermarked:
                verdict.spoof_check = self._spoof_check(verdict, marks, ids, common, scored.spoof_units, match)
        if self.paraphrases is not None and spec.needs_key:
            # every keyed verdict: a paraphrase keeps what our output said, not its tokens (never changes the verdict)
            verdict.paraphrase_of_own_output = self.paraphrases.fact(normalized.text, [m.key_id for m in marks])
        return verdict

    def _spoof_check(self, verdict: Verdict, marks: list, ids: torch.Tensor, common, spoof_units: tuple | None,
                     match: tuple[str, Match] | None) -> dict | None:
        """The spoof check of a positive verdict (``detector.spoof_check``) on its best key's scored units (those
        of its scoring pass; counted again when it was scored without dedup: the check counts first occurrences
        all the same); our own output, edited or not, is checked as its null was: against the counts without it."""
        mark = next(m for m in marks if m.key_id == verdict.key_id)
        units = spoof_units if spoof_units is not None else scored_units(mark, ids, common)
        mine = match is not None and match[0] == mark.key_id and match[1].matches
        return verdict_spoof_check(mark, units, self.output_memory.view(mark.key_id),
                                   self.output_memory.units_of(mark.key_id, match[1].row) if mine else None)

    def _match_requests(self, marks: list) -> list | None:
        """Per tested key, its gram index's ``MatchRequest`` for the scoring kernel (None for a key with nothing
        remembered, or without the C kernels); None without a key to name the n-grams with."""
        key = self._grams_key()
        if key is None:
            return None
        return [self.output_memory.view(mark.key_id).grams.match_request(key) for mark in marks]

    def _grams_key(self) -> int | None:
        """The key of remembered outputs' n-grams (``db.output_grams.gram_key``), derived once; None when the
        keyring (a stand-in with secrets only) has no master key to derive it from."""
        if self._gram_key is None and has_master_key(self.keyring):
            self._gram_key = gram_key(self.keyring)
        return self._gram_key

    def _own_output(self, ids: torch.Tensor, marks: list, requests: list | None = None) -> tuple[str, Match] | None:
        """The remembered output of a tested key that the text repeats most (``db.output_grams``), with that
        key's id; None when no tested key has remembered outputs (or the keyring, a stand-in with secrets
        only, has no master key to key the n-grams with). ``requests``: ``_match_requests``' for these marks,
        each answered by the scoring kernel where it ran (else the key's index is asked here)."""
        key = self._grams_key()
        if key is None:
            return None
        best = None
        for i, mark in enumerate(marks):
            request = None if requests is None else requests[i]
            found = None if request is None else request.result()
            if found is None:
                found = self.output_memory.view(mark.key_id).grams.match_ids(ids.numpy(), key)
            if found is not None and (best is None or found.matched > best[1].matched):
                best = (mark.key_id, found)
        return best

    @property
    def dither_key(self) -> bytes:
        """The key of the detect-scope dither: derived from the master key, so every worker and both
        services draw the same u for the same text (a caller cannot re-draw it by hitting another worker);
        a keyring stand-in without a master key gets a per-process random one."""
        if self._dither_key is None:
            self._dither_key = dither_key_of(self.keyring) or secrets.token_bytes(32)
        return self._dither_key

    def common_units_for(self, spec: AnySpec, fresh: bool = True):
        """The common-unit table ``spec`` is scored with: None for a kind that counts every position, else the
        shipped table, merged with the deployment's own (``detector.your_units``) where it has one. ``fresh=False``:
        its record as of the calibration store's last check (``detect`` checks once per verdict)."""
        shipped = common_units.for_spec(spec, self.vocab)
        if shipped is None:
            return None
        return scoring_table(shipped, self.your_units(fresh))

    def your_units(self, fresh: bool = True):
        """The deployment's own texts' common-unit table for this detector's tokenizer (``detector.your_units``,
        verified), or None: what ``common_units_for`` merges into the shipped table."""
        yours = self._your_units
        if yours is None:
            store = self._calibration_store()
            if not isinstance(store, CalibrationStore):  # a keyring stand-in, or a worker shipped no table
                return None
            yours = self._your_units = YourUnits(self.keyring, store)
        if isinstance(yours, YourUnits):
            return yours.table(self.vocab.fingerprint, fresh)
        return yours

    def calibrations_for(self, marks: list[Watermark], fresh: bool = True) -> list[Calibration | None]:
        """Each key's calibration under the spec being tested (``detector.calibration``), or None."""
        if not marks or marks[0].key_id is None:
            return [None] * len(marks)
        store = self._calibration_store()
        if store is None:
            return [None] * len(marks)
        return [store.get(wm.key_id, wm.fingerprint, fresh) for wm in marks]

    def _calibration_store(self):
        """The calibrations this detector reads (the keyring home's ``CalibrationStore``, or those shipped to a
        batch worker); None for a keyring stand-in with secrets only."""
        if self._calibrations is None and has_master_key(self.keyring):
            self._calibrations = CalibrationStore(self.keyring)
        return self._calibrations

    def watermarks(self, spec: AnySpec, keys: Iterable[str] | None = None) -> list:
        """The watermarks a detection tests (``make_watermark``): one per key, or one public one (hf)."""
        vocab = self.vocab
        if not spec.needs_key:
            if keys is not None:
                raise FieldError("keys", "an hf spec is public (its hashing_key is in the spec); pass no key")
            return [self._cached(spec, None, lambda: make_watermark(spec, None, vocab.vocab_size))]
        with self._lock:
            self._refresh_if_keyring_changed()
            if keys is None:
                if self._detection_infos is None:
                    self._detection_infos = list(self.keyring.detection_keys())
                infos = list(self._detection_infos)
                if not infos:
                    raise KeyNotFoundError("no watermark key to detect with: create one with `provmark keys create`")
                if self._keys_are_bound():  # each key's spec parsed once per keyring version, not per verdict
                    bound = self._bound_infos.get(spec.format())
                    if bound is None:
                        if len(self._bound_infos) >= MAX_PUBLIC_SPECS:  # specs come from requests: bounded
                            self._bound_infos.clear()
                        bound = self._bound_infos[spec.format()] = keys_bound_to(infos, spec)
                    infos = bound
                key_ids = [info.key_id for info in infos]
            else:
                if isinstance(keys, str):
                    keys = [keys]
                key_ids = list(dict.fromkeys(keys))  # a key listed twice is tested once
                if not key_ids:
                    raise FieldError("keys", "expected at least one key id (or None for all detection keys)")
                if self._keys_are_bound():
                    if self._all_infos is None:
                        self._all_infos = {info.key_id: info for info in self.keyring.list()}
                    for key_id in key_ids:
                        known = self._all_infos
                        if key_id in known:  # an unknown id fails below, with the keyring's own message
                            require_bound(known[key_id], spec)
        return [self._cached(spec, key_id,
                             lambda k=key_id: make_watermark(spec, self.keyring.secret(k), vocab.vocab_size, k,
                                                             public_half=self._public_half(spec, k)))
                for key_id in key_ids]

    def _public_half(self, spec: AnySpec, key_id: str) -> bytes | None:
        """A two-part key's detection half when ``spec`` is its kgw spec (the verdict then reports what the
        public half says, ``detector.two_part``); None for one-part keys. A keyring stand-in (batch workers)
        answers through its ``public_half_of``, when it has one."""
        if is_sampling(spec) or not spec.needs_key:
            return None
        if not has_master_key(self.keyring):
            return self.keyring.public_half_of(key_id) if isinstance(self.keyring, HoldsPublishedHalves) else None
        with self._lock:
            if self._all_infos is None:
                self._all_infos = {info.key_id: info for info in self.keyring.list()}
            info = self._all_infos.get(key_id)
        return self.keyring.public_half(key_id) if info is not None and info.public_half else None

    def own_spec(self, keys: Iterable[str]) -> AnySpec | None:
        """The spec the named keys are bound to (``watermark.key_binding.shared_spec``); None (the default
        spec) for a keyring stand-in or unknown ids (they fail later with the keyring's message)."""
        key_ids = [keys] if isinstance(keys, str) else list(dict.fromkeys(keys))
        if not key_ids or not self._keys_are_bound():
            return None
        with self._lock:
            self._refresh_if_keyring_changed()
            if self._all_infos is None:
                self._all_infos = {info.key_id: info for info in self.keyring.list()}
            infos = [self._all_infos[k] for k in key_ids if k in self._all_infos]
        return shared_spec(infos)

    def _keys_are_bound(self) -> bool:
        """A real keyring records each key's spec; a stand-in holding secrets only has no binding to check."""
        return self._bind_keys and has_master_key(self.keyring)

    def _cached(self, spec: AnySpec, key_id: str | None, build):
        """The watermark of (spec, key), built once. Keyed entries are bounded by the keys and the specs they are
        bound to; public (hf) specs come from requests, so at most MAX_PUBLIC_SPECS of them are kept."""
        cache_key = (spec.format(), key_id)
        found = self._watermarks.get(cache_key)
        if found is None:
            found = build()
            with self._lock:
                public = [k for k in self._watermarks if k[1] is None] if key_id is None else []
                for stale in public[:max(0, len(public) - MAX_PUBLIC_SPECS + 1)]:
                    del self._watermarks[stale]
                self._watermarks[cache_key] = found
        return found

    def _refresh_if_keyring_changed(self) -> None:
        if self._keyring_file is None:
            self._keyring_file = os.fspath(self.keyring.path)  # a plain string: pathlib costs more than the stat
        try:
            st = os.stat(self._keyring_file)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp:
            self._stamp = stamp
            self._detection_infos = None
            self._all_infos = None
            self._bound_infos = {}
            self._watermarks = {k: w for k, w in self._watermarks.items() if k[1] is None}
