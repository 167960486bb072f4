"""``provmark keys calibrate [KEY_ID ...]``: measure keys' null on human text (and on the user's own,
``--corpus``) and store it; the detector then holds each key's verdicts to its measured null."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from api.cli.actions import Spelling
from api.cli.errors import CLIError
from api.cli.keys.audit import KeyEvent
from api.cli.keys.corpus import read_collections
from api.cli.keys.output import describe_calibration, print_json
from api.cli.keys.screening import show_progress, stale_note, table_for, your_units
from detector import calibrate as measuring
from detector import calibration
from detector.calibration import Calibration, CalibrationStore
from detector.calibration_plot import plot_calibrations
from detector.promise import kinds_of
from watermark.key_binding import bound_spec
from watermark.key_info import KeyInfo
from watermark.keys import Keyring
from watermark.public_key import public_half_id
from watermark.scheme import make_watermark
from watermark.vocab import load_vocabulary

NAME = "calibrate"
HELP = "measure keys' null on human text (mean and spread of z per length, realised vs stated FPR)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key_ids", nargs="*", metavar="KEY_ID", help="default: every detection key")
    parser.add_argument("--watermark", "--spec", dest="spec", action=Spelling, current="--watermark", append=True,
                        metavar="SPEC", help="watermark spec to calibrate under (repeatable; default: each key's own "
                                             "spec)")
    parser.add_argument("--plot", metavar="PNG", help="also plot each key's null against N(0, 1) into this file")
    parser.add_argument("--corpus", action="append", metavar="PATH",
                        help="also measure the key on human text of yours, the kind you detect (repeatable): a "
                             "directory (each UTF-8 file in it one text), a .jsonl file ({\"text\": ...} per line) "
                             "or a text file. Units common in these texts are left out of every later verdict "
                             "(the deployment's own common-unit table, replacing any earlier one; each PATH also "
                             "counts as a collection of its own), and per length "
                             "the more careful of their null and the shipped corpora's guards verdicts")
    parser.add_argument("--forget-corpus", action="store_true",
                        help="remove the deployment's own common-unit table (verdicts go back to the shipped one)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


@dataclass(slots=True)
class CalibrationPlan:
    """What a ``keys calibrate`` run measures, checked before anything is measured."""

    infos: list[KeyInfo]  # the keys, in the order asked for
    specs: list | None  # ``--spec``'s, or None: each key under its own spec
    collections: list[list[str]] | None  # the texts of each ``--corpus`` path

    @property
    def texts(self) -> list[str] | None:
        return None if self.collections is None else [text for found in self.collections for text in found]


@dataclass(slots=True)
class Measured:
    """A run's calibrations: those it reports (one per key and spec) and those it stores (with published halves')."""

    results: list[Calibration] = field(default_factory=list)
    stored: list[Calibration] = field(default_factory=list)
    events: list[KeyEvent] = field(default_factory=list)


def run(keyring: Keyring, args) -> list[KeyEvent]:
    plan = _plan(keyring, args)
    vocab = load_vocabulary()
    store = CalibrationStore(keyring)
    try:
        measuring.HumanWindows.for_vocabulary(vocab)
    except RuntimeError as exc:
        raise CLIError(str(exc)) from None
    texts = plan.texts
    your_ids = None if texts is None else measuring.token_ids_of(vocab, texts)
    your_kinds = None if texts is None else kinds_of(vocab, your_ids)  # verdicts of a kind measured here: "measured"
    yours, keep_yours = your_units(keyring, vocab, plan.collections, args)
    # stored once every key is measured: a failure leaves the table and calibrations as they were
    measured = _measure(keyring, plan, vocab, yours, your_ids, args, your_kinds)
    keep_yours()
    for result in measured.stored:
        store.put(result)
    stale_note(keyring, {info.key_id for info in plan.infos}, args)
    if args.plot:
        plot_calibrations(measured.results, args.plot)
    _report(measured.results, args)
    return measured.events


def _plan(keyring: Keyring, args) -> CalibrationPlan:
    """The keys, specs and texts asked for; a CLIError for anything that cannot be measured."""
    infos = {info.key_id: info for info in keyring.list()}
    key_ids = args.key_ids or [info.key_id for info in keyring.detection_keys()]
    if not key_ids:
        raise CLIError("no keys to calibrate: create one with `provmark keys create`")
    unknown = [k for k in key_ids if k not in infos]
    if unknown:
        raise CLIError(f"no key {unknown[0]} in the keyring")
    try:
        specs = [calibration.spec_for(text) for text in args.spec] if args.spec else None
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    keyless = [spec.format() for spec in specs or () if not spec.needs_key]
    if keyless:
        raise CLIError(f"{keyless[0]}: hf specs have no secret key to calibrate (their green lists are public)")
    if args.corpus and args.forget_corpus:
        raise CLIError("--forget-corpus removes your texts' common units; --corpus replaces them: choose one")
    collections = read_collections(args.corpus) if args.corpus else None  # bad paths fail before anything is measured
    return CalibrationPlan([infos[k] for k in key_ids], specs, collections)


def _measure(keyring: Keyring, plan: CalibrationPlan, vocab, yours, your_ids, args,
             your_kinds: list[str] | None = None) -> Measured:
    """Each key under each spec, on the shipped corpora (and the user's texts); a two-part key's published half
    under its own spec too, with the shipped table alone (as a public verifier scores it). ``your_kinds``: each of
    the user's texts' kind (``detector.promise.kinds_of``), recorded so verdicts on a kind measured here carry the
    measured promise."""
    measured = Measured()
    for info in plan.infos:
        key_id = info.key_id
        secret = keyring.secret(key_id)
        for spec in plan.specs or [bound_spec(info)]:
            mark = make_watermark(spec, secret, vocab.vocab_size, key_id=key_id)
            common = table_for(spec, vocab, yours)
            result = measuring.calibrate(mark, info.fingerprint, vocab, common, progress=show_progress(args))
            if your_ids is not None:
                try:
                    result = measuring.with_your_texts(result, mark, your_ids, common, progress=show_progress(args),
                                                       kinds=your_kinds)
                except ValueError as exc:
                    raise CLIError(f"--corpus under {spec.format()}: {exc}") from None
            measured.stored.append(result)
            measured.results.append(result)
            summary = result.summary()
            if info.public_half and spec.format() == bound_spec(info).format():
                public = measuring.public_half_calibration(spec, secret, vocab, table_for(spec, vocab, None))
                measured.stored.append(measuring.for_key(public, public_half_id(key_id)))
                summary["public_half"] = public.summary()
            measured.events.append(KeyEvent("calibrate", info, summary))
    return measured


def _report(results: list[Calibration], args) -> None:
    if args.json:
        print_json([{**r.summary(), "key_id": r.key_id,
                     "buckets": [b.to_dict(r.z_threshold) for b in r.buckets], "domains": r.domains}
                    for r in results])
        return
    for r in results:
        print(f"key {r.key_id}: {describe_calibration(r.summary())}")
        yours = r.domains.get(calibration.YOURS)
        if yours is not None:
            decided = ", ".join(yours["buckets"]) or "none (the shipped corpora's were as careful, or it had too few)"
            print(f"  your texts: {yours['n']} scored, mean z {yours['mean_z']:+.3f}, sd {yours['sd_z']:.3f}; "
                  f"length buckets decided by them: {decided}")
        for b in r.buckets:
            d = b.to_dict(r.z_threshold)
            fpr = "-" if d["realised_fpr"] is None else f"{d['realised_fpr']:.2g}"
            print(f"  T {d['bucket']:>9}: {d['n']:4d} texts, mean z {d['mean_z']:+.3f}, sd {d['sd_z']:.3f}, "
                  f"realised FPR at z={r.z_threshold:g}: {fpr}")
    if args.plot:
        print(f"plot: {args.plot}")
