"""The ``provmark`` command line: one module per command group (``register(subparsers)``), ``main`` in main.py."""

from api.cli.errors import CLIError
from api.cli.main import main

__all__ = ["CLIError", "main"]
