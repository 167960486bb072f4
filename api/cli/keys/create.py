"""``provmark keys create [KEY_ID]``: a new key, screened and calibrated under its spec unless told not to."""

from __future__ import annotations

import argparse

from api.cli.keys.audit import KeyEvent
from api.cli.keys.output import describe_calibration, print_json
from api.cli.keys.screening import add_screening_options, new_key_spec, screened
from watermark.key_info import STANDBY
from watermark.keys import Keyring

NAME = "create"
HELP = "create a key (active if none is active, else standby)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key_id", nargs="?", metavar="KEY_ID", help="public name; default k-<8 hex>")
    add_screening_options(parser)


def run(keyring: Keyring, args) -> list[KeyEvent]:
    spec = new_key_spec(args)
    info, summary = screened(keyring, args, lambda secret: keyring.create(args.key_id, secret=secret, spec=spec,
                                                                          public_half=args.public_half))
    if args.json:
        print_json({**info.to_dict(), "calibration": summary})
    else:
        print(f"created key {info.key_id} ({info.status}, fingerprint {info.fingerprint}, spec {info.spec})"
              + (f"; two-part: publish its public half with `provmark keys export-public {info.key_id}`"
                 if info.public_half else ""))
        if summary is not None:
            print(describe_calibration(summary))
        if info.status == STANDBY:
            print(f"used for detection now; make it the active key with `provmark keys rotate {info.key_id}`")
    return [KeyEvent("create", info)] + ([KeyEvent("calibrate", info, summary)] if summary else [])
