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


def warn_deprecated(old: str, current: str) -> None:
    """One line on stderr: ``old`` still works for this release; ``current`` is its spelling from now on."""
    print(f"provmark: warning: {old} is deprecated and goes in the next release; use {current}", file=sys.stderr)


class Spelling(argparse.Action):
    """An option under its current name and an old one that still works for one release: both store (or, with
    ``append=True``, append) to the same destination; the old one warns on stderr (``warn_deprecated``)."""

    def __init__(self, option_strings, dest, *, current: str, append: bool = False, **kwargs) -> None:
        self.current, self.append = current, append
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if option_string != self.current:
            warn_deprecated(option_string, self.current)
        if self.append:
            values = [*(getattr(namespace, self.dest, None) or []), values]
        setattr(namespace, self.dest, values)


class DeprecatedFlag(argparse.Action):
    """A flag that still works for one release (``store_true``), with a warning naming what replaces it."""

    def __init__(self, option_strings, dest, *, current: str, **kwargs) -> None:
        self.current = current
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        warn_deprecated(option_string, self.current)
        setattr(namespace, self.dest, True)
