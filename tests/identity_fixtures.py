"""A deployment's signing keys for tests: the identity made in a store, as the generation service does."""

from __future__ import annotations

from pathlib import Path

from api.provenance_keys import SigningKeys
from api.settings import Settings
from db.store import Store


def signing_keys_for(store: Store, home: Path, **settings) -> SigningKeys:
    """The signing keys of the deployment on ``store`` (made on first use), seen from the replica ``home``."""
    store.upgrade()
    return SigningKeys(Settings.load({"home": home, **settings}), store, create=True, actor="test")
