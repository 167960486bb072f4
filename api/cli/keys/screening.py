"""What the key actions that draw or measure keys share (``create``, ``rotate``, ``calibrate``): the spec a new
key is bound to, screening a new secret on human text (and the user's own, ``--corpus``), and the
deployment's own common-unit table those measurements are made under."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from api.cli.actions import Spelling
from api.cli.errors import CLIError
from api.cli.keys.corpus import read_collections
from detector import calibrate as measuring
from detector.calibration import CalibrationStore
from detector.common_units import for_spec, from_collections
from detector.promise import spec_note
from detector.your_units import YourUnits, scoring_table
from watermark.config import SpecError
from watermark.key_binding import spec_to_bind
from watermark.key_info import KeyInfo, KeyringError
from watermark.keys import Keyring
from watermark.public_key import public_half_id, require_two_part_spec
from watermark.specs import parse_spec
from watermark.vocab import load_vocabulary


def add_screening_options(parser: argparse.ArgumentParser) -> None:
    """The options of the actions that draw a new key (``create``, ``rotate``)."""
    parser.add_argument("--watermark", "--spec", dest="spec", action=Spelling, current="--watermark",
                        metavar="SPEC", default=None,
                        help="the spec the new key watermarks with (kgw:..., gumbel:..., synthid:... or "
                             "vllm:gumbel,...); the detector scores the key only under it (default: kgw:, the default spec)")
    parser.add_argument("--public-half", action="store_true",
                        help="a two-part key (kgw specs): its public half can be published (`keys export-public`) "
                             "so anyone verifies text; the private half stays here and catches spoofs made with it")
    parser.add_argument("--no-calibrate", action="store_true",
                        help="skip key screening and calibration (run `provmark keys calibrate` later)")
    parser.add_argument("--corpus", action="append", metavar="PATH",
                        help="also screen and calibrate the new key on human text of yours, the kind it will judge "
                             "(as `keys calibrate --corpus`, whose common-unit table it stores too): a key shifted on "
                             "it is drawn again")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def screened(keyring: Keyring, args, make: Callable[[bytes | None], KeyInfo]) -> tuple[KeyInfo, dict | None]:
    """``make(secret or None) -> KeyInfo``; unless --no-calibrate, with a screened secret and its
    calibration under the key's spec stored (and the summary of that calibration returned)."""
    if args.no_calibrate:
        if args.corpus:
            raise CLIError("--corpus screens and calibrates the new key: it cannot go with --no-calibrate")
        return make(None), None
    spec = bound_spec_of(args)
    collections = read_collections(args.corpus) if args.corpus else None  # bad paths fail before a key is drawn
    texts = None if collections is None else [text for found in collections for text in found]
    vocab = load_vocabulary()
    yours, keep_yours = your_units(keyring, vocab, collections, args)
    common = table_for(spec, vocab, yours)
    two_part = getattr(args, "public_half", False)
    your_ids = None if texts is None else measuring.token_ids_of(vocab, texts)
    try:
        secret, result, draws = measuring.screened_secret(spec, vocab, common, progress=show_progress(args),
                                                          two_part=two_part, your_ids=your_ids)
    except (RuntimeError, ValueError) as exc:
        raise CLIError(f"cannot screen the new key: {exc}; or pass --no-calibrate") from None
    info = make(secret)
    keep_yours()  # the deployment's table goes with the key that was screened under it
    stale_note(keyring, {info.key_id}, args)
    result = measuring.for_key(result, info.key_id)
    store = CalibrationStore(keyring)
    store.put(result)
    summary = {**result.summary(), "screening_draws": draws}
    if two_part:  # the public half's null is public metadata too (`keys export-public` carries it), measured
        # under the shipped table alone, as a public verifier scores it
        public = measuring.public_half_calibration(spec, secret, vocab, table_for(spec, vocab, None))
        store.put(measuring.for_key(public, public_half_id(info.key_id)))
        summary["public_half"] = public.summary()
    return info, summary


def your_units(keyring: Keyring, vocab, collections: list[list[str]] | None, args):
    """(the deployment's own common-unit table (``detector.your_units``) that keys are measured under, as the
    detector will score with it; ``keep()``, which stores the change once the measuring is done): built from
    ``collections`` (the texts of each ``--corpus`` path, each path also counted on its own), replacing the stored
    one; none with ``--forget-corpus``; else the stored one."""
    store = YourUnits(keyring)
    if getattr(args, "forget_corpus", False):
        def forget() -> None:
            removed = store.forget(vocab.fingerprint)
            if not args.json:
                print("your texts' common units: " + ("removed; verdicts use the shipped table alone" if removed
                                                       else "there were none"))
        return None, forget
    if collections is None:
        return store.table(vocab.fingerprint), lambda: None
    table = from_collections(vocab, collections)

    def keep() -> None:
        record = store.put(table, sum(len(found) for found in collections))
        if not args.json:
            print(f"your texts' common units: {record['entries']} units from {record['texts']} texts (table "
                  f"{record['digest']}); every later verdict leaves them out, as it does the shipped table's")
    return table, keep


def table_for(spec, vocab, yours):
    """The common-unit table ``spec`` is measured under: the shipped one, merged with ``yours`` when given."""
    return scoring_table(for_spec(spec, vocab), yours)


def stale_note(keyring: Keyring, measured: set[str], args) -> None:
    """After the deployment's own table changed: the keys whose stored calibrations were measured under the
    previous one (the detector now ignores those) and were not measured again here."""
    if args.json or not (args.corpus or getattr(args, "forget_corpus", False)):
        return
    others = [info.key_id for info in keyring.detection_keys()
              if info.key_id not in measured and CalibrationStore(keyring).for_key(info.key_id)]
    if others:
        print(f"note: {', '.join(others)} were calibrated under the previous common-unit table; calibrate "
              f"them again (`provmark keys calibrate {' '.join(others)}`) or the detector holds them uncalibrated")


def show_progress(args) -> bool:
    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


def bound_spec_of(args):
    """The spec a new key is bound to: ``--watermark`` or the default spec; a clear error for a bad one."""
    try:
        spec = parse_spec(args.spec)  # parsed once, here at the door
        spec_to_bind(spec)  # a spec a key can be bound to (a keyed family's)
        return spec
    except SpecError as exc:
        raise CLIError(f"--watermark: {exc}") from None


def new_key_spec(args):
    """The spec a new key (``create``, ``rotate``) is bound to, checked before anything is screened or written;
    a scheme that cannot judge a kind of text (unigram on code) is said on standard error where it is picked."""
    spec = bound_spec_of(args)
    check_two_part(args, spec)
    note = spec_note(spec)
    if note:
        print(f"provmark: {note}", file=sys.stderr)
    return spec


def check_two_part(args, spec) -> None:
    """A clear error before anything is screened or written: two-part keys are kgw keys."""
    if args.public_half:
        try:
            require_two_part_spec(spec.format())
        except KeyringError as exc:
            raise CLIError(f"--public-half: {exc}") from None
