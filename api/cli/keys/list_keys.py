"""``provmark keys list``: every key, oldest first, with its calibration under its own spec."""

from __future__ import annotations

import argparse

from api.cli.keys.output import calibration_column, format_table, print_json
from detector.your_units import YourUnits
from watermark.key_info import KeyringError
from watermark.keys import Keyring

NAME = "list"
HELP = "list keys, oldest first"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``list`` takes no options besides ``--json``."""


def run(keyring: Keyring, args) -> list:
    infos = keyring.list()
    column = calibration_column(keyring)
    if args.json:
        print_json([{**info.to_dict(), "calibrations": column.get(info.key_id, [])} for info in infos])
        return []
    if not infos:
        print("no keys yet: create one with `provmark keys create`")
        return []
    print(format_table(infos, column))
    try:
        records = YourUnits(keyring).records()
    except KeyringError:  # said by the calibration column already
        records = {}
    for record in records.values():
        print(f"your texts' common units: {record['entries']} units from {record['texts']} texts (table "
              f"{record['digest']}), left out of every keyed verdict; `keys calibrate --forget-corpus` removes them")
    return []
