"""What the command groups with actions (``provmark keys create``, ``provmark db tokens list`` ...) share."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def add_action(actions, name: str, help_text: str, run: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """A sub-command ``name`` of ``actions`` (an argparse sub-parsers object) that calls ``run(args)``;
    its description is its help as a sentence."""
    parser = actions.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
    parser.set_defaults(func=run)
    return parser


def usage(parser: argparse.ArgumentParser) -> int:
    """A group called without an action: its usage on stderr, exit status 2."""
    parser.print_help(sys.stderr)
    return 2
