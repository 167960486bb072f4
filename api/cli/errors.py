"""The one error type a CLI command raises for bad input."""


class CLIError(Exception):
    """A user-facing error: printed as ``provmark: <message>``, exit status 2."""
