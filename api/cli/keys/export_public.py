"""``provmark keys export-public KEY_ID [--out FILE]``: a two-part key's public half."""

from __future__ import annotations

import argparse
import sys

from api.cli.errors import CLIError
from api.cli.keys.audit import KeyEvent
from detector.two_part import published_document
from watermark.keys import Keyring
from watermark.vocab import load_vocabulary

NAME = "export-public"
HELP = "write a two-part key's public half (anyone verifies text with it)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key_id", metavar="KEY_ID")
    parser.add_argument("--out", metavar="FILE",
                        help="write the document here (it holds nothing secret) instead of standard output")


def run(keyring: Keyring, args) -> list[KeyEvent]:
    """The public-key document (``watermark.public_key.PublicKey``): never the secret."""
    info = next((k for k in keyring.list() if k.key_id == args.key_id), None)
    if info is None:
        raise CLIError(f"no key {args.key_id} in the keyring (see `provmark keys list`)")
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
    return [KeyEvent("export_public", info, {"public_fingerprint": document.fingerprint})]
