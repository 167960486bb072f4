"""``provmark keys rotate [NEW_ID]``: a new (or a standby) key becomes the active one; the old one stays for
detection until retired."""

from __future__ import annotations

import argparse

from api.cli.errors import CLIError
from api.cli.keys.audit import KeyEvent
from api.cli.keys.output import calibration_column, describe_calibration, format_table, print_json
from api.cli.keys.screening import add_screening_options, new_key_spec, screened
from watermark.keys import Keyring

NAME = "rotate"
HELP = "make a new (or a standby) key active; the old one stays for detection"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("new_id", nargs="?", metavar="NEW_ID", help="new key id or an existing standby key")
    add_screening_options(parser)


def run(keyring: Keyring, args) -> list[KeyEvent]:
    before = {k.key_id: k.status for k in keyring.list()}
    if args.new_id is not None and args.new_id in before:  # an existing standby key: already screened or not
        if args.corpus:
            raise CLIError(f"--corpus screens a new key; {args.new_id} exists: measure it on your texts with "
                           f"`provmark keys calibrate {args.new_id} --corpus PATH`")
        info, summary = keyring.rotate(args.new_id), None
    else:
        spec = new_key_spec(args)
        info, summary = screened(keyring, args, lambda secret: keyring.rotate(args.new_id, secret=secret, spec=spec,
                                                                              public_half=args.public_half))
    after = keyring.list()
    if args.json:
        print_json({**info.to_dict(), "calibration": summary})
    else:
        print(f"key {info.key_id} is now active (fingerprint {info.fingerprint})")
        if summary is not None:
            print(describe_calibration(summary))
        print("earlier keys stay in detection until retired:")
        print(format_table(after, calibration_column(keyring)))
    demoted = [KeyEvent("rotate_out", k) for k in after if k.key_id != info.key_id and before.get(k.key_id) != k.status]
    return [KeyEvent("rotate", info), *demoted] + ([KeyEvent("calibrate", info, summary)] if summary else [])
