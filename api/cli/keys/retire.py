"""``provmark keys retire KEY_ID [--purge]``: a key leaves detection (and, purged, its secret is erased)."""

from __future__ import annotations

import argparse

from api.cli.keys.audit import KeyEvent
from api.cli.keys.output import print_json
from watermark.keys import Keyring

NAME = "retire"
HELP = "stop using a key for detection (the active key: rotate first)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key_id", metavar="KEY_ID")
    parser.add_argument("--purge", action="store_true", help="also erase the secret for good (irreversible)")


def run(keyring: Keyring, args) -> list[KeyEvent]:
    info = keyring.retire(args.key_id, purge=args.purge)
    if args.json:
        print_json(info.to_dict())
    else:
        kept = "its secret was erased" if info.purged else "its secret is kept for audits (--purge erases it)"
        print(f"retired key {info.key_id}: no longer used for detection; {kept}")
    return [KeyEvent("retire", info)]
