"""What every ``provmark keys`` action leaves in the store: a ``key.<action>`` audit event per key it changed
(``KeyEvent``), with the key's public metadata; a calibration's event carries its summary. A key retired with
``--purge`` also loses what the semantic memory kept of its outputs (``db.semantic_memory``)."""

from __future__ import annotations

import getpass
from dataclasses import dataclass

from api.cli.errors import CLIError
from db.semantic_memory import SemanticMemory
from db.store import Store, StoreError
from watermark.key_info import KeyInfo

ACTIONS = ("create", "rotate", "rotate_out", "calibrate", "export_public", "retire")


@dataclass(slots=True, frozen=True)
class KeyEvent:
    """One audited key action: ``key.<action>`` for ``info``'s key, with ``details`` (public facts) when given."""

    action: str
    info: KeyInfo
    details: dict | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action: expected one of {', '.join(ACTIONS)}, got {self.action!r}")


def record_key_events(events: list[KeyEvent]) -> None:
    """Write each event (and its key's public metadata) to the store; a CLIError says the keyring kept the
    change when the store could not take it."""
    if not events:
        return
    try:
        store = Store()
        store.upgrade()
        for event in events:
            store.record_key_event(event.info, event.action, actor=f"cli:{getpass.getuser()}", details=event.details)
            if event.action == "retire" and event.info.purged:
                SemanticMemory(store).purge(event.info.key_id)
    except StoreError as exc:
        raise CLIError(f"the key change is saved in the keyring, but its audit event was not written: {exc}") from None
