"""Where a ``Detector`` reads keys from: the keyring itself or a stand-in that holds secrets only.

The keyring (``watermark.keys.Keyring``) has a master key, so everything derived from it or MACed with it is
there too: the detect-scope dither's key, the n-gram key of remembered outputs, the calibrations and the
deployment's own common-unit table stored beside it, and each key's bound spec. A stand-in
(``KeyringStandIn``: a batch worker's ``SecretsKeyring``, a published half, the fixed keys of a test or
benchmark) has none of these; the detector then uses what it was shipped, or goes without.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

from watermark.keys import Keyring


class KeyringStandIn(Protocol):
    """What a ``Detector`` needs of a keyring that holds secrets only."""

    path: Path  # a file the detector stats to notice new keys; a stand-in's never changes

    def secret(self, key_id: str) -> bytes: ...

    def detection_keys(self) -> Iterable: ...


@runtime_checkable
class HoldsPublishedHalves(Protocol):
    """A stand-in that also holds two-part keys' published halves (``detector.batch_secrets.SecretsKeyring``)."""

    def public_half_of(self, key_id: str) -> bytes | None: ...


KeySource = Keyring | KeyringStandIn


def has_master_key(keyring: KeySource) -> bool:
    """True for the keyring itself; a stand-in has no master key, nor anything derived from it or stored beside it."""
    return isinstance(keyring, Keyring)
