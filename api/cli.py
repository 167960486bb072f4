"""The ``provmark`` command line.

Each command group lives in its own module exposing ``register(subparsers)``; the module's parser
sets ``func`` to a callable ``(args) -> int``. A ``CLIError`` becomes a one-line message on stderr
and exit code 2; nothing secret goes into those messages.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that add sub-commands, in help order.
COMMAND_MODULES = ("api.cli_keys", "api.cli_detect", "api.cli_detect_batch", "api.cli_generate", "api.cli_db",
                   "api.cli_serve", "api.cli_eval")


class CLIError(Exception):
    """A user-facing error: printed as ``provmark: <message>``, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="provmark", description="LLM watermarking and provenance")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # command group not built yet
                continue
            raise
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


if __name__ == "__main__":
    # run as a module, this file is __main__ and not api.cli: use api.cli's CLIError
    from api.cli import main as _main

    sys.exit(_main())
