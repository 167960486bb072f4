"""``provmark keys``: create, list, rotate, calibrate and retire watermark keys.

Output is a table for people or, with ``--json``, JSON for programs (one object per key; ``list``
prints an array). Only public facts are shown: id, status, fingerprint, spec, times and calibrations,
never a secret. A key is bound to one spec (``--spec``: kgw, gumbel:, synthid: or vllm:gumbel) and
screened and calibrated under it; ``keys list`` marks a calibration ``stale`` when it was measured under
a common-unit table the detector no longer uses (the detector then ignores it: calibrate again).
The keyring lives in ``$PROVMARK_HOME``; its master key comes from ``PROVMARK_MASTER_KEY`` or
``$PROVMARK_HOME/master.key`` (see ``watermark.keys``).
"""

from __future__ import annotations

import argparse
import json
import sys

from api.cli.actions import add_action, usage
from api.cli.errors import CLIError
from db.store import Store, StoreError
from detector import calibration
from detector.calibration import CalibrationStore, CalibrationStoreError
from detector.calibration_plot import plot_calibrations
from watermark.config import SpecError
from watermark.key_binding import bound_spec, spec_to_bind
from watermark.key_info import STANDBY, KeyInfo, KeyringError
from watermark.keys import Keyring
from watermark.public_key import public_half_id, require_two_part_spec
from watermark.specs import parse_spec
from watermark.vocab import load_vocabulary

COLUMNS = ("KEY ID", "STATUS", "FINGERPRINT", "CREATED (UTC)", "RETIRED (UTC)", "SPEC")


def register(subparsers) -> None:
    keys = subparsers.add_parser(
        "keys",
        help="manage watermark keys",
        description="Manage watermark keys (stored encrypted in $PROVMARK_HOME/keyring.json).",
    )
    keys.set_defaults(func=lambda args: usage(keys))
    actions = keys.add_subparsers(dest="keys_action", metavar="ACTION")

    create = _action(actions, "create", "create a key (active if none is active, else standby)", _create)
    create.add_argument("key_id", nargs="?", metavar="KEY_ID", help="public name; default k-<8 hex>")
    _calibration_options(create)

    _action(actions, "list", "list keys, oldest first", _list)

    rotate_help = "make a new (or a standby) key active; the old one stays for detection"
    rotate = _action(actions, "rotate", rotate_help, _rotate)
    rotate.add_argument("new_id", nargs="?", metavar="NEW_ID", help="new key id or an existing standby key")
    _calibration_options(rotate)

    calibrate_help = "measure keys' null on human text (mean and spread of z per length, realised vs stated FPR)"
    calibrate = _action(actions, "calibrate", calibrate_help, _calibrate)
    calibrate.add_argument("key_ids", nargs="*", metavar="KEY_ID", help="default: every detection key")
    calibrate.add_argument("--spec", action="append", metavar="SPEC",
                           help="watermark spec to calibrate under (repeatable; default: each key's own spec)")
    calibrate.add_argument("--plot", metavar="PNG", help="also plot each key's null against N(0, 1) into this file")
    calibrate.add_argument("--corpus", action="append", metavar="PATH",
                           help="also measure the key on human text of yours, the kind you detect (repeatable): a "
                                "directory (each UTF-8 file in it one text), a .jsonl file ({\"text\": ...} per line) "
                                "or a text file. Units common in these texts are left out of every later verdict "
                                "(the deployment's own common-unit table, replacing any earlier one; each PATH also "
                                "counts as a collection of its own), and per length "
                                "the more careful of their null and the shipped corpora's guards verdicts")
    calibrate.add_argument("--forget-corpus", action="store_true",
                           help="remove the deployment's own common-unit table (verdicts go back to the shipped one)")
    calibrate.add_argument("--no-progress", action="store_true", help="no progress bar")

    export_help = "write a two-part key's publishable detection half (anyone verifies text with it)"
    export = _action(actions, "export-public", export_help, _export_public)
    export.add_argument("key_id", metavar="KEY_ID")
    export.add_argument("--out", metavar="FILE", help="write the document here (it holds nothing secret) instead of standard output")

    retire_help = "stop using a key for detection (the active key: rotate first)"
    retire = _action(actions, "retire", retire_help, _retire)
    retire.add_argument("key_id", metavar="KEY_ID")
    retire.add_argument("--purge", action="store_true", help="also erase the secret for good (irreversible)")


def _action(actions, name: str, help_text: str, handler) -> argparse.ArgumentParser:
    parser = add_action(actions, name, help_text, lambda args: _run(handler, args))
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _run(handler, args) -> int:
    try:
        changed = handler(Keyring(), args) or []
    except (KeyringError, CalibrationStoreError) as exc:  # these messages never carry secrets
        raise CLIError(str(exc)) from None
    _audit(changed)
    return 0


def _audit(changed: list[tuple]) -> None:
    """Every key action writes a ``key.<action>`` audit event (and the key's public metadata) to the store;
    a calibration's event carries its summary."""
    if not changed:
        return
    import getpass

    try:
        store = Store()
        store.upgrade()
        for action, info, *details in changed:
            store.record_key_event(info, action, actor=f"cli:{getpass.getuser()}", details=details[0] if details else None)
    except StoreError as exc:
        raise CLIError(f"the key change is saved in the keyring, but its audit event was not written: {exc}") from None


def _calibration_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", metavar="SPEC", default=None,
                        help="the spec the new key watermarks with (kgw:..., gumbel:..., synthid:... or "
                             "vllm:gumbel,...); the detector scores the key only under it (default: the default spec)")
    parser.add_argument("--public-half", action="store_true",
                        help="a two-part key (kgw specs): its detection half can be published (`keys export-public`) "
                             "so anyone verifies text; the private half stays here and catches spoofs made with it")
    parser.add_argument("--no-calibrate", action="store_true",
                        help="skip key screening and calibration (run `provmark keys calibrate` later)")
    parser.add_argument("--corpus", action="append", metavar="PATH",
                        help="also screen and calibrate the new key on human text of yours, the kind it will judge "
                             "(as `keys calibrate --corpus`, whose common-unit table it stores too): a key shifted on "
                             "it is drawn again")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _screened(keyring: Keyring, args, make) -> tuple[KeyInfo, dict | None]:
    """``make(secret or None) -> KeyInfo``; unless --no-calibrate, with a screened secret and its
    calibration under the key's spec stored."""
    if args.no_calibrate:
        if args.corpus:
            raise CLIError("--corpus screens and calibrates the new key: it cannot go with --no-calibrate")
        return make(None), None
    spec = _spec_to_bind(args)
    collections = read_collections(args.corpus) if args.corpus else None  # bad paths fail before a key is drawn
    texts = None if collections is None else [text for found in collections for text in found]
    vocab, measuring = _material()
    yours, keep_yours = _your_units(keyring, vocab, collections, args)
    common = _scoring_table(spec, vocab, yours)
    two_part = getattr(args, "public_half", False)
    your_ids = None if texts is None else measuring.token_ids_of(vocab, texts)
    try:
        secret, result, draws = measuring.screened_secret(spec, vocab, common, progress=_progress(args),
                                                          two_part=two_part, your_ids=your_ids)
    except (RuntimeError, ValueError) as exc:
        raise CLIError(f"cannot screen the new key: {exc}; or pass --no-calibrate") from None
    info = make(secret)
    keep_yours()  # the deployment's table goes with the key that was screened under it
    _stale_note(keyring, {info.key_id}, args)
    result = measuring.for_key(result, info.key_id)
    store = calibration.CalibrationStore(keyring)
    store.put(result)
    summary = {**result.summary(), "screening_draws": draws}
    if two_part:  # the published half's null is public metadata too (`keys export-public` carries it), measured
        # under the shipped table alone, as a public verifier scores it
        public = measuring.public_half_calibration(spec, secret, vocab, _scoring_table(spec, vocab, None))
        store.put(measuring.for_key(public, public_half_id(info.key_id)))
        summary["public_half"] = public.summary()
    return info, summary


def _your_units(keyring: Keyring, vocab, collections: list[list[str]] | None, args):
    """(the deployment's own common-unit table (``detector.your_units``) that keys are measured under, as the
    detector will score with it; ``keep()``, which stores the change once the measuring is done): built from
    ``collections`` (the texts of each ``--corpus`` path, each path also counted on its own), replacing the stored
    one; none with ``--forget-corpus``; else the stored one."""
    from detector.common_units import from_collections
    from detector.your_units import YourUnits

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


def _scoring_table(spec, vocab, yours):
    from detector.common_units import for_spec
    from detector.your_units import scoring_table

    return scoring_table(for_spec(spec, vocab), yours)


def _stale_note(keyring: Keyring, measured: set[str], args) -> None:
    """After the deployment's own table changed: the keys whose stored calibrations were measured under the
    previous one (the detector now ignores those) and were not measured again here."""
    if args.json or not (args.corpus or getattr(args, "forget_corpus", False)):
        return
    others = [info.key_id for info in keyring.detection_keys()
              if info.key_id not in measured and CalibrationStore(keyring).for_key(info.key_id)]
    if others:
        print(f"note: {', '.join(others)} were calibrated under the previous common-unit table; calibrate "
              f"them again (`provmark keys calibrate {' '.join(others)}`) or the detector holds them uncalibrated")


def _material():
    """(vocabulary, detector.calibrate): what screening and calibrating need."""
    # local: calibrating loads torch and the human corpora; `keys list` and the others should not
    from detector import calibrate

    return load_vocabulary(), calibrate


def _progress(args) -> bool:
    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


def _describe_calibration(summary: dict) -> str:
    factor = summary["worst_guarded_fpr"] / summary["stated_fpr"]
    state = "passes screening" if summary["passes_screen"] else "FAILS screening"
    worst = summary["max_abs_mean_z"]
    worst = "-" if worst is None else f"{worst:.3f}"
    return (f"calibration {summary['id']} ({summary['spec']}): max |mean z| {worst} over length buckets; "
            f"false-positive rate at most {factor:.2f}x the stated {summary['stated_fpr']:.2g}; {state}"
            + (f"; with {summary['your_texts']} texts of yours" if "your_texts" in summary else ""))


def _spec_to_bind(args):
    """The spec a new key is bound to: ``--spec`` or the default spec; a clear error for a bad one."""
    try:
        return parse_spec(spec_to_bind(args.spec))
    except SpecError as exc:
        raise CLIError(f"--spec: {exc}") from None


def _create(keyring: Keyring, args) -> list[tuple[str, KeyInfo]]:
    spec = _spec_to_bind(args)
    _check_two_part(args, spec)
    from detector.promise import spec_note  # local: numpy and the promise's tables only when a key is made

    if spec_note(spec):  # a scheme that cannot judge a kind of text (unigram on code): said where it is picked
        print(f"provmark: {spec_note(spec)}", file=sys.stderr)
    info, summary = _screened(keyring, args, lambda secret: keyring.create(args.key_id, secret=secret, spec=spec,
                                                                           public_half=args.public_half))
    if args.json:
        _print_json({**info.to_dict(), "calibration": summary})
    else:
        print(f"created key {info.key_id} ({info.status}, fingerprint {info.fingerprint}, spec {info.spec})"
              + (f"; two-part: publish its detection half with `provmark keys export-public {info.key_id}`"
                 if info.public_half else ""))
        if summary is not None:
            print(_describe_calibration(summary))
        if info.status == STANDBY:
            print(f"used for detection now; make it the active key with `provmark keys rotate {info.key_id}`")
    return [("create", info)] + ([("calibrate", info, summary)] if summary else [])


def _calibrate(keyring: Keyring, args) -> list[tuple[str, KeyInfo]]:
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
    texts = None if collections is None else [text for found in collections for text in found]
    vocab, measuring = _material()
    from watermark.scheme import make_watermark  # local, as _material
    store = calibration.CalibrationStore(keyring)
    results, changed = [], []
    try:
        measuring.HumanWindows.for_vocabulary(vocab)
    except RuntimeError as exc:
        raise CLIError(str(exc)) from None
    your_ids = None if texts is None else measuring.token_ids_of(vocab, texts)
    your_kinds = None if texts is None else measuring.kinds_of(vocab, your_ids)  # verdicts of a kind measured here: promise "measured"
    yours, keep_yours = _your_units(keyring, vocab, collections, args)
    measured = []  # stored once every key is measured: a failure leaves the table and calibrations as they were
    for key_id in key_ids:
        info = infos[key_id]
        secret = keyring.secret(key_id)
        for spec in specs or [bound_spec(info)]:
            mark = make_watermark(spec, secret, vocab.vocab_size, key_id=key_id)
            common = _scoring_table(spec, vocab, yours)
            result = measuring.calibrate(mark, info.fingerprint, vocab, common, progress=_progress(args))
            if your_ids is not None:
                try:
                    result = measuring.with_your_texts(result, mark, your_ids, common, progress=_progress(args),
                                                       kinds=your_kinds)
                except ValueError as exc:
                    raise CLIError(f"--corpus under {spec.format()}: {exc}") from None
            measured.append(result)
            results.append(result)
            summary = result.summary()
            # the published half's null too, under the shipped table alone (as a public verifier scores it)
            if info.public_half and spec.format() == bound_spec(info).format():
                public = measuring.public_half_calibration(spec, secret, vocab, _scoring_table(spec, vocab, None))
                measured.append(measuring.for_key(public, public_half_id(key_id)))
                summary["public_half"] = public.summary()
            changed.append(("calibrate", info, summary))
    keep_yours()
    for result in measured:
        store.put(result)
    _stale_note(keyring, set(key_ids), args)
    if args.plot:
        plot_calibrations(results, args.plot)
    if args.json:
        _print_json([{**r.summary(), "key_id": r.key_id,
                      "buckets": [b.to_dict(r.z_threshold) for b in r.buckets], "domains": r.domains}
                     for r in results])
    else:
        for r in results:
            print(f"key {r.key_id}: {_describe_calibration(r.summary())}")
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
    return changed


def read_corpus(paths: list[str]) -> list[str]:
    """The texts of ``--corpus`` paths (``read_collections``), as one list."""
    return [text for found in read_collections(paths) for text in found]


def read_collections(paths: list[str]) -> list[list[str]]:
    """The texts of each ``--corpus`` path (one collection per path; paths without text are dropped): a directory
    gives each regular file under it that is UTF-8 text (hidden files and folders, and files that are not text,
    are skipped), a ``.jsonl`` file the ``text`` of each line, any other file its whole text. CLIError for a
    missing path, a bad JSONL line, a file that is not UTF-8 text, or no text at all."""
    from pathlib import Path

    collections: list[list[str]] = []
    for given in paths:
        texts: list[str] = []
        collections.append(texts)
        path = Path(given)
        if path.is_dir():
            for found in sorted(path.rglob("*")):
                parts = found.relative_to(path).parts
                if found.is_file() and not any(part.startswith(".") for part in parts):
                    text = _text_of(found)
                    if text is not None:
                        texts.append(text)
        elif path.is_file():
            if path.suffix == ".jsonl":
                texts.extend(_jsonl_texts(path))
            else:
                text = _text_of(path)
                if text is None:
                    raise CLIError(f"--corpus {given}: not UTF-8 text")
                texts.append(text)
        else:
            raise CLIError(f"--corpus {given}: no such file or directory")
    collections = [found for found in ([t for t in texts if t.strip()] for texts in collections) if found]
    if not collections:
        raise CLIError(f"--corpus {' '.join(paths)}: no text found")
    return collections


def _text_of(path) -> str | None:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CLIError(f"--corpus {path}: {exc.strerror or exc}") from None
    if b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _jsonl_texts(path) -> list[str]:
    # the same record rule as `provmark detect --jsonl`
    from api.cli.detect import parse_record

    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"--corpus {path}: cannot read it as UTF-8 text ({exc.__class__.__name__})") from None
    return [parse_record(line, f"--corpus {path}", number)["text"]
            for number, line in enumerate(lines, 1) if line.strip()]


def _list(keyring: Keyring, args) -> None:
    infos = keyring.list()
    column = _calibration_column(keyring)
    if args.json:
        return _print_json([{**info.to_dict(), "calibrations": column.get(info.key_id, [])} for info in infos])
    if not infos:
        print("no keys yet: create one with `provmark keys create`")
        return
    print(format_table(infos, column))
    from detector.your_units import YourUnits  # local: numpy only, no tokenizer

    try:
        records = YourUnits(keyring).records()
    except KeyringError:  # said by the calibration column already
        records = {}
    for record in records.values():
        print(f"your texts' common units: {record['entries']} units from {record['texts']} texts (table "
              f"{record['digest']}), left out of every keyed verdict; `keys calibrate --forget-corpus` removes them")


def _calibration_column(keyring: Keyring) -> dict[str, list[dict]]:
    """key id -> summaries of its calibrations, each marked ``stale`` when the detector would not use it (an
    unreadable calibration file is said, not fatal)."""
    from detector.common_units import current_digests  # local: numpy only, no tokenizer
    from detector.your_units import YourUnits

    store = CalibrationStore(keyring)
    out = {}
    try:
        current = current_digests(YourUnits(keyring))
        for info in keyring.list():
            out[info.key_id] = [{**c.summary(), "stale": calibration.is_stale(c, current)}
                                for c in store.for_key(info.key_id)]
    except KeyringError as exc:  # an unreadable calibration file or table of your texts' units
        print(f"warning: {exc}", file=sys.stderr)
    return out


def _rotate(keyring: Keyring, args) -> list[tuple[str, KeyInfo]]:
    before = {k.key_id: k.status for k in keyring.list()}
    if args.new_id is not None and args.new_id in before:  # an existing standby key: already screened or not
        if args.corpus:
            raise CLIError(f"--corpus screens a new key; {args.new_id} exists: measure it on your texts with "
                           f"`provmark keys calibrate {args.new_id} --corpus PATH`")
        info, summary = keyring.rotate(args.new_id), None
    else:
        spec = _spec_to_bind(args)
        _check_two_part(args, spec)
        info, summary = _screened(keyring, args, lambda secret: keyring.rotate(args.new_id, secret=secret, spec=spec,
                                                                               public_half=args.public_half))
    after = keyring.list()
    if args.json:
        _print_json({**info.to_dict(), "calibration": summary})
    else:
        print(f"key {info.key_id} is now active (fingerprint {info.fingerprint})")
        if summary is not None:
            print(_describe_calibration(summary))
        print("earlier keys stay in detection until retired:")
        print(format_table(after, _calibration_column(keyring)))
    demoted = [("rotate_out", k) for k in after if k.key_id != info.key_id and before.get(k.key_id) != k.status]
    return [("rotate", info), *demoted] + ([("calibrate", info, summary)] if summary else [])


def _check_two_part(args, spec) -> None:
    """A clear error before anything is screened or written: two-part keys are kgw keys."""
    if args.public_half:
        try:
            require_two_part_spec(spec.format())
        except KeyringError as exc:
            raise CLIError(f"--public-half: {exc}") from None


def _export_public(keyring: Keyring, args) -> list[tuple[str, KeyInfo]]:
    """The public-key document (``watermark.public_key.PublicKey``): never the secret."""
    info = next((k for k in keyring.list() if k.key_id == args.key_id), None)
    if info is None:
        raise CLIError(f"no key {args.key_id} in the keyring (see `provmark keys list`)")
    from detector.two_part import published_document  # local, as _material: it loads torch

    document = published_document(keyring, info, load_vocabulary())  # KeyStateError for a one-part key
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as handle:
                handle.write(document.to_json())
        except OSError as exc:
            raise CLIError(f"cannot write {args.out}: {exc.strerror or exc}") from None
        print(f"wrote the public half of key {info.key_id} (fingerprint {document.fingerprint}) to {args.out}")
    else:
        sys.stdout.write(document.to_json())
    return [("export_public", info, {"public_fingerprint": document.fingerprint})]


def _retire(keyring: Keyring, args) -> list[tuple[str, KeyInfo]]:
    info = keyring.retire(args.key_id, purge=args.purge)
    if args.json:
        _print_json(info.to_dict())
    else:
        kept = "its secret was erased" if info.purged else "its secret is kept for audits (--purge erases it)"
        print(f"retired key {info.key_id}: no longer used for detection; {kept}")
    return [("retire", info)]


def format_table(infos: list[KeyInfo], calibrations: dict[str, list[dict]] | None = None) -> str:
    """A fixed-width table of public key facts (and, given, each key's calibration under its own spec)."""
    columns = COLUMNS + (("CALIBRATION (own spec)",) if calibrations is not None else ())
    rows = [columns] + [
        (
            info.key_id,
            info.status + (" (purged)" if info.purged else ""),
            info.fingerprint,
            info.created_at,
            info.retired_at or "-",
            bound_spec(info).format() + (" (two-part)" if info.public_half else ""),
        ) + ((_calibration_cell(info, calibrations.get(info.key_id, [])),) if calibrations is not None else ())
        for info in infos
    ]
    widths = [max(len(row[col]) for row in rows) for col in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _calibration_cell(info: KeyInfo, summaries: list[dict]) -> str:
    own = bound_spec(info).format()
    found = next((c for c in summaries if c["spec"] == own), None)
    if found is None:
        return "none (provmark keys calibrate)"
    if found.get("stale"):
        return f"{found['id']} stale: made under another common-unit table, not used (provmark keys calibrate)"
    factor = found["worst_guarded_fpr"] / found["stated_fpr"]
    worst = "-" if found["max_abs_mean_z"] is None else f"{found['max_abs_mean_z']:.2f}"
    return f"{found['id']} max|mean z| {worst}, FPR <= {factor:.1f}x stated"


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2))
