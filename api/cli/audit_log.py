"""``provmark audit head | prove | check-proof | log-key``: the transparency log from the command line.

  provmark audit head [--every S] [--json]           sign and keep a tree head over every event so far (with
                                                     --every: again every S seconds while the log grows)
  provmark audit prove ID [--tree-size N] [--out F]  inclusion proof of an event (seq, event id or subject id)
  provmark audit prove --consistency FIRST SECOND    consistency proof between two kept head sizes
  provmark audit check-proof FILE --log-key KEY      check a proof offline (KEY: PEM, base64, JWK(S) file or URL)
      [--witness VKEY ...] [--cosigned FILE ...]      and require each witness's cosignature on its head(s)
  provmark audit log-key [--jwk | --pem] [--json]    the log's public key

A proof that fails exits 1 with the reason; bad input exits 2 (``provmark: ...`` on stderr).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from api.cli.actions import add_action
from api.cli.documents import is_file, is_url, read_document
from api.cli.errors import CLIError
from api.cli.identity_keys import public_identity, signing_keys
from api.settings import Settings
from db.store import Store
from db.transparency import SIGNER_STATE_FILE, HeadGuard, LogError, consistency_proof, inclusion_proof, keep_tree_head
from provenance.log_key import LogKeyError, read_public_key
from provenance.log_signer import public_document
from provenance.proof_bundle import ProofError, bundle_key_id, check_bundle
from provenance.tree_head import TreeHeadError, parse_checkpoint
from provenance.witness import WitnessError, merge_cosignatures, parse_witness_vkey, verify_cosignature

MAX_KEY_BYTES = 1 << 20  # a JWKS is a few KiB; more is not a key document
MAX_BUNDLE_BYTES = 1 << 20  # a bundle holds at most 2 heads and 64 hashes
MAX_CHECKPOINT_BYTES = 1 << 16  # a checkpoint is a few lines, one per signature
HEAD_FIELDS = ("tree_head", "first_head", "second_head")


def register(audit_actions, store_action) -> None:
    """Add the log actions to the ``audit`` group; ``store_action`` wraps a handler given an open Store."""
    head = store_action(audit_actions, "head", "sign and keep a tree head of the transparency log, and print it",
                        _head)
    head.add_argument("--every", type=float, metavar="S", help="keep signing: a new head every S seconds while "
                      "the log grows (a log-signing job for deployments without a generation service)")
    head.add_argument("--json", action="store_true", help="machine-readable output")

    prove = store_action(audit_actions, "prove", "a proof bundle: an event's inclusion in the log, or the "
                         "consistency of two kept tree heads", _prove)
    prove.add_argument("reference", nargs="?", metavar="ID",
                       help="the event: its seq, event id, or subject id (receipt, verdict, manifest or key id)")
    prove.add_argument("--tree-size", type=int, metavar="N", help="prove against the kept head of this size "
                       "(default: the newest kept head that contains the event, else one signed now)")
    prove.add_argument("--consistency", nargs=2, type=int, metavar=("FIRST", "SECOND"),
                       help="prove that the kept head of size SECOND extends the one of size FIRST")
    prove.add_argument("--out", type=Path, metavar="FILE", help="write the bundle to FILE instead of stdout")
    prove.add_argument("--json", action="store_true", help="also print the bundle when writing it with --out")

    check = add_action(audit_actions, "check-proof", "check a proof bundle offline against the log's public key",
                       _check_proof)
    check.add_argument("bundle", metavar="FILE", help="the bundle (- for stdin)")
    check.add_argument("--log-key", required=True, metavar="KEY",
                       help="the log's public key: PEM or raw base64 text or file, a verifier key, a JWK or "
                            "JWKS file, or an http(s) URL serving a JWKS or /v1/log/public-key")
    check.add_argument("--witness", action="append", metavar="VKEY",
                       help="also require a valid cosignature by this witness (its verifier key, as `provmark log "
                            "witness-key` prints it, or a file holding it) on the bundle's head(s); repeatable")
    check.add_argument("--cosigned", action="append", metavar="FILE",
                       help="a checkpoint a witness cosigned (what `provmark log witness` prints): its signature "
                            "lines are added to the bundle's head of the same size and root; repeatable")
    check.add_argument("--json", action="store_true", help="machine-readable output")

    key = store_action(audit_actions, "log-key", "print the transparency log's public key", _log_key)
    form = key.add_mutually_exclusive_group()
    form.add_argument("--jwk", action="store_true", help="as a JWK (kid: its RFC 7638 thumbprint)")
    form.add_argument("--pem", action="store_true", help="as PEM (SubjectPublicKeyInfo)")
    key.add_argument("--json", action="store_true", help="every form, as one JSON document")


def log_guard() -> HeadGuard:
    try:
        return HeadGuard(Settings.load().home / SIGNER_STATE_FILE)
    except LogError as error:
        raise CLIError(str(error)) from None


def _head(store: Store, args) -> int:
    store.upgrade()
    if args.every is not None and not args.every > 0:
        raise CLIError(f"--every: expected a positive number of seconds, got {args.every}")
    signer, guard = signing_keys(store).log, log_guard()
    try:
        head = keep_tree_head(store, signer, guard=guard)
        while args.every is not None:
            time.sleep(args.every)
            head = keep_tree_head(store, signer, reuse_within_s=args.every, guard=guard)
            print(f"tree head of size {head.tree_size}", flush=True)
    except LogError as error:
        raise CLIError(str(error)) from None
    if args.json:
        print(json.dumps(head.to_dict(), indent=2))
        return 0
    print(f"tree head of size {head.tree_size}, timestamp {head.timestamp} ms, signed by key {head.key_id}")
    print(f"root {head.root_hash.hex()}")
    print(head.checkpoint, end="")
    return 0


def _prove(store: Store, args) -> int:
    if (args.reference is None) == (args.consistency is None):
        raise CLIError("give an event ID to prove its inclusion, or --consistency FIRST SECOND (not both)")
    if args.consistency is not None and args.tree_size is not None:
        raise CLIError("--tree-size is for inclusion proofs; --consistency names both sizes")
    if args.tree_size is not None and args.tree_size < 1:
        raise CLIError("--tree-size must be at least 1")
    store.upgrade()
    try:
        if args.consistency is not None:
            bundle = consistency_proof(store, *args.consistency)
            summary = (f"consistency proof from size {bundle['first_size']} to size {bundle['second_size']} "
                       f"({len(bundle['consistency_path'])} hashes)")
        else:
            bundle = inclusion_proof(store, signing_keys(store).log, args.reference, args.tree_size)
            summary = (f"inclusion proof of event {bundle['entry_json']['seq']} (leaf {bundle['leaf_index']} of "
                       f"{bundle['tree_size']})")
    except LogError as error:
        raise CLIError(str(error)) from None
    text = json.dumps(bundle, indent=2)
    if args.out is None:
        print(text)
        return 0
    try:
        args.out.write_text(text + "\n")
    except OSError as error:
        raise CLIError(f"cannot write {args.out}: {error.strerror or error}") from None
    print(text if args.json else f"wrote the {summary} to {args.out}")
    return 0


def _check_proof(args) -> int:
    bundle = _read_bundle(args.bundle)
    try:
        key = read_public_key(key_text(args.log_key), key_id=bundle_key_id(bundle))
    except LogKeyError as error:
        raise CLIError(f"--log-key: {error}") from None
    witnesses = [_witness_key(value) for value in args.witness or []]
    for source in args.cosigned or []:
        _add_cosignatures(bundle, _checkpoint_text(source))
    try:
        proven = check_bundle(bundle, key)
        for name, witness_key in witnesses:
            for field in HEAD_FIELDS:
                if isinstance(bundle.get(field), dict):
                    verify_cosignature(bundle[field]["checkpoint"], name, witness_key)
            proven += f"; cosigned by witness {name}"
    except (ProofError, WitnessError) as error:
        print(json.dumps({"ok": False, "reason": str(error)}) if args.json else f"FAILED: {error}")
        return 1
    print(json.dumps({"ok": True, "proves": proven}) if args.json else f"OK: {proven}")
    return 0


def _log_key(store: Store, args) -> int:
    document = public_document(public_identity(store).log_key())
    if args.json:
        print(json.dumps(document, indent=2))
    elif args.jwk:
        print(json.dumps(document["jwk"], indent=2))
    elif args.pem:
        print(document["pem"], end="")
    else:
        print(f"key id        {document['key_id']}\nlog id        {document['log_id']}\n"
              f"origin        {document['origin']}\nverifier key  {document['verifier_key']}")
        print(document["pem"], end="")
    return 0


def _read_bundle(name: str):
    raw = read_document(name, MAX_BUNDLE_BYTES, "the proof bundle")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise CLIError(f"{name} is not JSON: a proof bundle is the JSON `provmark audit prove` writes") from None


def _witness_key(value: str):
    text = value
    if is_file(value):
        text = read_document(value, MAX_CHECKPOINT_BYTES, "--witness").decode("utf-8", "replace")
    try:
        return parse_witness_vkey(text)
    except WitnessError as error:
        raise CLIError(f"--witness: {error}") from None


def _checkpoint_text(source: str) -> str:
    try:
        text = read_document(source, MAX_CHECKPOINT_BYTES, "--cosigned").decode("utf-8")
        parse_checkpoint(text)
    except (UnicodeDecodeError, TreeHeadError):
        raise CLIError(f"--cosigned: {source} is not a checkpoint note (what `provmark log witness` prints)") from None
    return text


def _add_cosignatures(bundle, cosigned: str) -> None:
    """The signature lines of ``cosigned`` added to each head of ``bundle`` with the same note body."""
    for field in HEAD_FIELDS:
        head = bundle.get(field) if isinstance(bundle, dict) else None
        if isinstance(head, dict) and isinstance(head.get("checkpoint"), str):
            with contextlib.suppress(WitnessError):  # a malformed head: check_bundle says so
                head["checkpoint"] = merge_cosignatures(head["checkpoint"], cosigned)


def key_text(value: str) -> str:
    """The key document KEY names: fetched from a URL, read from a file, or KEY itself."""
    if not (is_url(value) or is_file(value)):
        return value
    raw = read_document(value, MAX_KEY_BYTES, "--log-key")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CLIError(f"--log-key: {value} is not text (PEM, base64 or JSON)") from None

