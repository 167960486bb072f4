"""``provmark log``: the transparency log seen from outside. Its witness (``provenance.witness``) here.

  provmark log witness --log URL --state DIR [--name NAME] [--log-key KEY] [--json]
  provmark log witness-key --state DIR [--name NAME]

The witness's state folder DIR holds::

  witness.key    its Ed25519 private key (PKCS#8 PEM, mode 0600), made on first use
  witness.json   {"name": its name}, fixed when the key is made
  log.json       {"log", "log_key" (the pinned log key as a note verifier key), "tree_size", "checkpoint" (the
                 last checkpoint it cosigned), "cosigned_at"}: replaced whole (temporary file, fsync, rename)
                 and only when a checkpoint is cosigned

A run fetches URL/v1/log/head, and URL/v1/log/proof/consistency from the size it last cosigned, checks
them against the pinned log key and the kept checkpoint, cosigns (C2SP tlog-cosignature v1), keeps the new
checkpoint and prints it. It exits 0 when it cosigned, 1 when it refuses (the reason is printed, the state
is left as it was), 2 on bad input or a log it cannot reach. ``register`` makes the ``log`` group; further
actions are added to the sub-parsers it returns.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from api.cli.actions import add_action, usage
from api.cli.audit_log import key_text
from api.cli.documents import FETCH_TIMEOUT_S, is_url
from api.cli.errors import CLIError
from provenance.log_key import LogKeyError, parse_verifier_key, raw_key, read_public_key, verifier_key
from provenance.tree_head import TreeHeadError, parse_checkpoint
from provenance.witness import (
    INCONSISTENT,
    KEY_CHANGED,
    Refusal,
    WitnessError,
    check_name,
    default_name,
    load_private_key_pem,
    new_witness_key,
    private_key_pem,
    witness_update,
    witness_vkey,
)

KEY_FILE, IDENTITY_FILE, STATE_FILE = "witness.key", "witness.json", "log.json"
MAX_HEAD_BYTES = 1 << 16  # a head is under 1 KiB, a few cosignatures included
MAX_DOCUMENT_BYTES = 1 << 20  # a key document or a consistency bundle (at most 64 hashes and 2 heads)


def register(subparsers):
    """The ``log`` group with its actions; returns its sub-parsers, for more actions."""
    help_text = "the transparency log seen from outside: run a witness that cosigns its heads"
    group = subparsers.add_parser("log", help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
    group.set_defaults(func=lambda args: usage(group))
    actions = group.add_subparsers(dest="log_action", metavar="ACTION")

    witness = add_action(actions, "witness", "check that a log's newest head extends the last one this witness "
                         "cosigned, then cosign it (C2SP tlog-cosignature); exit 1, saying why, when it does not",
                         _witness)
    witness.add_argument("--log", required=True, metavar="URL", help="the detector's base URL (http or https)")
    _state_arguments(witness)
    witness.add_argument("--log-key", metavar="KEY",
                         help="the log's public key, as for `audit check-proof --log-key` (PEM, base64, verifier "
                              "key, JWK(S) file or URL). Safer than the default on a first run, which trusts the key "
                              "URL/v1/log/public-key serves then; either way the key is pinned in DIR from the "
                              "first run on, and a different key is refused")
    witness.add_argument("--json", action="store_true", help="machine-readable output")

    vkey = add_action(actions, "witness-key", "print the witness's verifier key (made on first use), which "
                      "`audit check-proof --witness` takes", _witness_key)
    _state_arguments(vkey)
    return actions


def _state_arguments(parser) -> None:
    parser.add_argument("--state", required=True, type=Path, metavar="DIR",
                        help="the witness's folder: its key, its name, the pinned log key, the last cosigned head")
    parser.add_argument("--name", metavar="NAME", help="the witness's name when its key is made (default: "
                        "provmark.witness/<16 hex digits of its key's SHA-256>); fixed afterwards")


# ---- the state folder ------------------------------------------------------------------------------

def _write_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """``path`` holds ``data`` or what it held before, never part of either."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as out:
            os.fchmod(out.fileno(), mode)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _identity(state: Path, name: str | None):
    """(name, private key) of the witness in ``state``; made there (key mode 0600) when absent."""
    try:
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        key_file, identity_file = state / KEY_FILE, state / IDENTITY_FILE
        if not key_file.exists():
            key = new_witness_key()
            chosen = check_name(name) if name is not None else default_name(key.public_key())
            _write_atomically(identity_file, json.dumps({"name": chosen}).encode() + b"\n")
            _write_atomically(key_file, private_key_pem(key))
            return chosen, key
        if key_file.stat().st_mode & 0o077:
            raise CLIError(f"{key_file} is readable by others: `chmod 600` it (and make a new witness key if it "
                           "may have been read)")
        key = load_private_key_pem(key_file.read_bytes())
        stored = json.loads(identity_file.read_text()).get("name")
        check_name(stored)
    except WitnessError as error:
        raise CLIError(f"--state {state}: {error}") from None
    except (OSError, ValueError, AttributeError) as error:
        raise CLIError(f"--state {state}: cannot read or write the witness's files "
                       f"({getattr(error, 'strerror', None) or type(error).__name__})") from None
    if name is not None and name != stored:
        raise CLIError(f"this witness is named {stored!r}; its name is fixed when its key is made")
    return stored, key


def _saved_state(state: Path) -> dict | None:
    path = state / STATE_FILE
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
        parse_verifier_key(saved["log_key"])
        parse_checkpoint(saved["checkpoint"])
    except (OSError, ValueError, KeyError, TypeError, LogKeyError, TreeHeadError):
        raise CLIError(f"{path} is damaged: it is not what `provmark log witness` writes") from None
    return saved


# ---- the log over HTTP --------------------------------------------------------------------------------

def _get(url: str, limit: int) -> tuple[int, object]:
    """(status, parsed JSON or None) of a GET; CLIError when the log cannot be reached."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=FETCH_TIMEOUT_S) as response:
            status, raw = response.status, response.read(limit + 1)
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read(limit + 1)
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise CLIError(f"cannot fetch {url}: {getattr(error, 'reason', None) or error}") from None
    if len(raw) > limit:
        raise CLIError(f"{url} answered more than {limit} bytes")
    try:
        return status, json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return status, None


def _error_text(body) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    return str(message) if message else "no reason given"


def _newest_checkpoint(base: str) -> str:
    status, head = _get(base + "/v1/log/head", MAX_HEAD_BYTES)
    if status != 200 or not isinstance(head, dict) or not isinstance(head.get("checkpoint"), str):
        raise CLIError(f"{base}/v1/log/head answered {status}: {_error_text(head)}")
    return head["checkpoint"]


def _served_log_key(base: str):
    status, document = _get(base + "/v1/log/public-key", MAX_DOCUMENT_BYTES)
    try:
        if status != 200:
            raise LogKeyError(f"it answered {status}: {_error_text(document)}")
        return read_public_key(json.dumps(document))
    except LogKeyError as error:
        raise CLIError(f"{base}/v1/log/public-key: {error}") from None


def _consistency_path(base: str, first: int, second: int) -> list[bytes]:
    """The path the log serves from size ``first`` to ``second``; Refusal when it cannot prove one."""
    url = f"{base}/v1/log/proof/consistency?first={first}&second={second}"
    status, bundle = _get(url, MAX_DOCUMENT_BYTES)
    if status in (404, 409):
        raise Refusal(INCONSISTENT, f"the log cannot prove that its tree of size {second} extends the tree of size "
                                    f"{first} this witness cosigned: {_error_text(bundle)}")
    if status != 200 or not isinstance(bundle, dict):
        raise CLIError(f"{url} answered {status}: {_error_text(bundle)}")
    nodes = bundle.get("consistency_path")
    try:
        return [base64.b64decode(node, validate=True) for node in nodes]
    except (TypeError, ValueError, binascii.Error):
        raise Refusal(INCONSISTENT, f"the log's consistency proof from size {first} to {second} is not a list of "
                                    "base64 hashes") from None


# ---- the actions ----------------------------------------------------------------------------------------

def _witness(args) -> int:
    base = args.log.rstrip("/")
    if not is_url(base):
        raise CLIError("--log must be the detector's http(s) base URL")
    name, private_key = _identity(args.state, args.name)
    saved = _saved_state(args.state)
    try:
        given = read_public_key(key_text(args.log_key)) if args.log_key else None
    except LogKeyError as error:
        raise CLIError(f"--log-key: {error}") from None
    try:
        if saved is not None:
            origin, log_key = parse_verifier_key(saved["log_key"])
            if given is not None and raw_key(given) != raw_key(log_key):
                raise Refusal(KEY_CHANGED, f"--log-key is not the key this witness pinned for {origin} "
                                           f"({saved['log_key']})")
            previous = saved["checkpoint"]
        else:
            origin, log_key, previous = None, given or _served_log_key(base), None
        checkpoint = _newest_checkpoint(base)
        old_size = parse_checkpoint(previous).tree_size if previous is not None else 0
        try:
            new_size = parse_checkpoint(checkpoint).tree_size
        except TreeHeadError:
            new_size = old_size  # witness_update refuses it, with the reason
        path = _consistency_path(base, old_size, new_size) if 0 < old_size < new_size else []
        cosigned = witness_update(previous, log_key, checkpoint, path, name, private_key, origin=origin)
    except Refusal as refusal:
        print(json.dumps({"ok": False, "refusal": refusal.kind, "reason": refusal.reason}) if args.json
              else f"REFUSED: {refusal.reason}")
        return 1
    origin = parse_checkpoint(cosigned).origin
    record = {"log": base, "log_key": verifier_key(origin, log_key), "tree_size": new_size, "checkpoint": cosigned,
              "cosigned_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    try:
        _write_atomically(args.state / STATE_FILE, json.dumps(record, indent=2).encode() + b"\n")
    except OSError as error:
        raise CLIError(f"cannot write {args.state / STATE_FILE}: {error.strerror or error}") from None
    account = f"cosigned {origin} at size {new_size}, " + (
        "its first head (log key pinned)" if previous is None else
        "the tree it cosigned before" if new_size == old_size else f"which extends size {old_size}")
    if args.json:
        print(json.dumps({"ok": True, "origin": origin, "tree_size": new_size,
                          "previous_size": old_size if previous is not None else None,
                          "witness": witness_vkey(name, private_key.public_key()), "checkpoint": cosigned}, indent=2))
    else:
        print(account, file=sys.stderr)
        print(cosigned, end="")
    return 0


def _witness_key(args) -> int:
    name, private_key = _identity(args.state, args.name)
    print(witness_vkey(name, private_key.public_key()))
    return 0
