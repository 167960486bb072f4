"""``provmark keys``: create, list, rotate and retire watermark keys.

Output is a table for people or, with ``--json``, JSON for programs (one object per key; ``list``
prints an array). Only public facts are shown: id, status, fingerprint and times, never a secret.
The keyring lives in ``$PROVMARK_HOME``; its master key comes from ``PROVMARK_MASTER_KEY`` or
``$PROVMARK_HOME/master.key`` (see ``watermark.keys``).
"""

from __future__ import annotations

import argparse
import json
import sys

from api.cli import CLIError
from watermark.keys import STANDBY, KeyInfo, Keyring, KeyringError

COLUMNS = ("KEY ID", "STATUS", "FINGERPRINT", "CREATED (UTC)", "RETIRED (UTC)")


def register(subparsers) -> None:
    keys = subparsers.add_parser(
        "keys",
        help="manage watermark keys",
        description="Manage watermark keys (stored encrypted in $PROVMARK_HOME/keyring.json).",
    )
    keys.set_defaults(func=lambda args: _usage(keys))
    actions = keys.add_subparsers(dest="keys_action", metavar="ACTION")

    create = _action(actions, "create", "create a key (active if none is active, else standby)", _create)
    create.add_argument("key_id", nargs="?", metavar="KEY_ID", help="public name; default k-<8 hex>")

    _action(actions, "list", "list keys, oldest first", _list)

    rotate_help = "make a new (or a standby) key active; the old one stays for detection"
    rotate = _action(actions, "rotate", rotate_help, _rotate)
    rotate.add_argument("new_id", nargs="?", metavar="NEW_ID", help="new key id or an existing standby key")

    retire_help = "stop using a key for detection (the active key: rotate first)"
    retire = _action(actions, "retire", retire_help, _retire)
    retire.add_argument("key_id", metavar="KEY_ID")
    retire.add_argument("--purge", action="store_true", help="also erase the secret for good (irreversible)")


def _action(actions, name: str, help_text: str, handler) -> argparse.ArgumentParser:
    parser = actions.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=lambda args: _run(handler, args))
    return parser


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _run(handler, args) -> int:
    try:
        changed = handler(Keyring(), args) or []
    except KeyringError as exc:  # keyring messages never carry secrets
        raise CLIError(str(exc)) from None
    _audit(changed)
    return 0


def _audit(changed: list[tuple[str, KeyInfo]]) -> None:
    """Every key action writes a ``key.<action>`` audit event (and the key's public metadata) to the store."""
    if not changed:
        return
    import getpass

    from detector.store import Store, StoreError

    try:
        store = Store()
        store.upgrade()
        for action, info in changed:
            store.record_key_event(info, action, actor=f"cli:{getpass.getuser()}")
    except StoreError as exc:
        raise CLIError(f"the key change is saved in the keyring, but its audit event was not written: {exc}") from None


def _create(keyring: Keyring, args) -> list[tuple[str, KeyInfo]]:
    info = keyring.create(args.key_id)
    if args.json:
        _print_json(info.to_dict())
    else:
        print(f"created key {info.key_id} ({info.status}, fingerprint {info.fingerprint})")
        if info.status == STANDBY:
            print(f"used for detection now; make it the active key with `provmark keys rotate {info.key_id}`")
    return [("create", info)]


def _list(keyring: Keyring, args) -> None:
    infos = keyring.list()
    if args.json:
        return _print_json([info.to_dict() for info in infos])
    if not infos:
        print("no keys yet: create one with `provmark keys create`")
        return
    print(format_table(infos))


def _rotate(keyring: Keyring, args) -> list[tuple[str, KeyInfo]]:
    before = {k.key_id: k.status for k in keyring.list()}
    info = keyring.rotate(args.new_id)
    after = keyring.list()
    if args.json:
        _print_json(info.to_dict())
    else:
        print(f"key {info.key_id} is now active (fingerprint {info.fingerprint})")
        print("earlier keys stay in detection until retired:")
        print(format_table(after))
    demoted = [("rotate_out", k) for k in after if k.key_id != info.key_id and before.get(k.key_id) != k.status]
    return [("rotate", info), *demoted]


def _retire(keyring: Keyring, args) -> list[tuple[str, KeyInfo]]:
    info = keyring.retire(args.key_id, purge=args.purge)
    if args.json:
        _print_json(info.to_dict())
    else:
        kept = "its secret was erased" if info.purged else "its secret is kept for audits (--purge erases it)"
        print(f"retired key {info.key_id}: no longer used for detection; {kept}")
    return [("retire", info)]


def format_table(infos: list[KeyInfo]) -> str:
    """A fixed-width table of public key facts."""
    rows = [COLUMNS] + [
        (
            info.key_id,
            info.status + (" (purged)" if info.purged else ""),
            info.fingerprint,
            info.created_at,
            info.retired_at or "-",
        )
        for info in infos
    ]
    widths = [max(len(row[col]) for row in rows) for col in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2))
