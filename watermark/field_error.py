"""FieldError: a ValueError that names the field it is about, so a service answers with that field without reading
the message (``api.generation.routes_common``, ``api.detector.routes_detect``)."""

from __future__ import annotations


class FieldError(ValueError):
    """A bad value of one named field: ``field`` as the code spells it, ``reason`` what is wrong with it.
    ``str()`` is ``message`` when given, else ``"field: reason"``."""

    def __init__(self, field: str, reason: str, message: str | None = None) -> None:
        super().__init__(message if message is not None else f"{field}: {reason}")
        self.field = field
        self.reason = reason
