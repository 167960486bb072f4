"""Who wrote a row: an API token or a local actor; the audit log names it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Caller:
    """Who asked: an API token (id and name) or a local actor such as ``cli``."""

    name: str
    token_id: str | None = None

    @property
    def actor(self) -> str:
        return f"token:{self.token_id}" if self.token_id else self.name
