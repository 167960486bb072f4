"""The ``provmark`` command line: the parser over every command group, and ``main``.

Each command group lives in its own module exposing ``register(subparsers)``; the module's parser
sets ``func`` to a callable ``(args) -> int``. A ``CLIError`` becomes a one-line message on stderr
and exit code 2; nothing secret goes into those messages.
"""

from __future__ import annotations

import argparse
import sys

from api.cli import (
    db,
    detect,
    detect_batch,
    evaluate,
    generate,
    identity,
    keys,
    log_witness,
    manifests,
    receipts,
    serve,
)
from api.cli.errors import CLIError

# Modules that add sub-commands, in help order.
COMMAND_MODULES = (keys, detect, detect_batch, generate, receipts, manifests, identity, db, log_witness, serve,
                   evaluate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="provmark", description="LLM watermarking and provenance")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except CLIError as exc:
        print(f"provmark: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
