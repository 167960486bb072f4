"""The deployment's provenance identity in the shared database (``provenance.identity`` for the records).

Every replica reads the same rows, so every replica publishes the same JWKS, log key and C2PA trust anchor,
and every generation replica signs with the same keys. The identity is made once: by ``provmark identity
init`` on an admin machine, or by the first start of a generation service on SQLite (one machine). Making it
adopts the key files an older single-machine home kept (``provenance.identity_files``), so what they signed
keeps verifying. Concurrent makers collide on the one ``deployment_identity`` row: one wins, the others read
its keys.

Reading needs the master key (every record's MAC is checked) but opens no private key; only
``current_private`` does, and only the services that sign call it. A receipt-key rotation is one
transaction under the audit chain's lock, the same lock a receipt's storage takes, so a receipt is never
stored under a key retired before it was signed (``db.receipts.issue_receipt``).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from db.audit import append_event, lock_chain
from db.rows import IdentityRow, SigningKeyRow, iso_utc, utc_now
from db.store import Store
from provenance.identity import (
    C2PA_ROOT,
    C2PA_SIGNER,
    LOG,
    RECEIPT,
    ROLES,
    IdentityError,
    IdentityMissing,
    IdentitySeal,
    KeyRecord,
    PublicIdentity,
)
from provenance.identity_files import home_conflicts, home_records
from watermark.keys import Keyring
from watermark.paths import provmark_home

IDENTITY_ROW_ID = 1
REFRESH_S = 5.0  # a replica re-reads the public identity at most this often (JWKS, log key, trust anchors)
ROTATE_EVENT = "key.receipt_rotate"


def seal_of(home: Path | None = None, create: bool = False) -> IdentitySeal:
    """The seal of the master key ``home``'s keyring uses (``PROVMARK_MASTER_KEY`` or ``master.key``);
    ``create``: make ``master.key`` if there is none (only where a new identity may be made)."""
    keyring = Keyring(Path(home).expanduser() if home is not None else provmark_home())
    return IdentitySeal(keyring.derive_key if create else keyring.derive_existing_key)


def _record(row: SigningKeyRow) -> KeyRecord:
    try:
        sealed = json.loads(row.sealed) if row.sealed is not None else None
    except ValueError:
        raise IdentityError(f"the {row.role} key {row.kid} is damaged") from None
    return KeyRecord(row.role, row.kid, row.public_key, row.created_at, row.retired_at, row.certificate,
                     sealed, row.mac)


def _row(record: KeyRecord) -> SigningKeyRow:
    return SigningKeyRow(role=record.role, kid=record.kid, public_key=record.public_key,
                         created_at=record.created_at, retired_at=record.retired_at,
                         certificate=record.certificate,
                         sealed=json.dumps(record.sealed, sort_keys=True) if record.sealed is not None else None,
                         mac=record.mac)


def read_identity(session: Session, seal: IdentitySeal) -> PublicIdentity | None:
    """The identity as stored, every record authenticated; None before it is made."""
    if session.get(IdentityRow, IDENTITY_ROW_ID) is None:
        return None
    rows = session.scalars(select(SigningKeyRow).order_by(SigningKeyRow.id)).all()
    identity = PublicIdentity(tuple(seal.check(_record(row)) for row in rows))
    for role in ROLES:
        if sum(1 for r in identity.records if r.role == role and r.retired_at is None) != 1:
            raise IdentityError(f"the deployment's identity has not exactly one current {role} key")
    return identity


def load_identity(store: Store, seal: IdentitySeal) -> PublicIdentity | None:
    with store.read() as session:
        return read_identity(session, seal)


def new_records(seal: IdentitySeal, development_ca, adopt_home: Path | None = None) -> list[KeyRecord]:
    """The records of a new identity: a home's key files adopted where it has them, fresh keys for the
    rest. ``development_ca(now)`` makes a development CA: (root key, root PEM, signing key, signing PEM)."""
    now = iso_utc(utc_now())
    records = home_records(adopt_home, seal, now) if adopt_home is not None else []
    have = {r.role for r in records if r.retired_at is None}
    if RECEIPT not in have:
        records.append(seal.new(RECEIPT, Ed25519PrivateKey.generate(), now))
    if LOG not in have:
        records.append(seal.new(LOG, Ed25519PrivateKey.generate(), now))
    if C2PA_ROOT not in have or C2PA_SIGNER not in have:
        records = [r for r in records if r.role not in (C2PA_ROOT, C2PA_SIGNER)]
        root_key, root_pem, signer_key, signer_pem = development_ca(utc_now())
        records += [seal.new(C2PA_ROOT, root_key, now, root_pem), seal.new(C2PA_SIGNER, signer_key, now, signer_pem)]
    return records


def create_identity(store: Store, seal: IdentitySeal, records: list[KeyRecord], actor: str) -> PublicIdentity:
    """Store ``records`` as the deployment's identity unless one exists; returns the identity that holds."""
    identity = PublicIdentity(tuple(records))
    try:
        with store.write() as session:
            if session.get(IdentityRow, IDENTITY_ROW_ID) is None:
                session.add(IdentityRow(id=IDENTITY_ROW_ID, deployment_id=identity.deployment_id,
                                        created_at=utc_now()))
                session.flush()  # a concurrent maker fails here, before any key is written
                session.add_all(_row(record) for record in records)
                append_event(session, "key.identity_create", actor, identity.deployment_id,
                             {"deployment_id": identity.deployment_id,
                              "keys": [{"role": r.role, "kid": r.kid} for r in records]})
    except IntegrityError:
        pass  # another process made it first: its identity is the deployment's
    current = load_identity(store, seal)
    if current is None:
        raise IdentityError("the deployment's identity could not be stored")
    return current


def ensure_identity(store: Store, seal: IdentitySeal, home: Path, development_ca, *, create: bool,
                    actor: str) -> PublicIdentity:
    """The deployment's identity, checked against ``home``: made (adopting ``home``'s key files) when there is
    none and ``create``; IdentityError when there is none and not ``create``, or when ``home`` holds other
    keys than the deployment's (a replica must not serve with another identity than the database's)."""
    identity = load_identity(store, seal)
    if identity is None:
        if not create:
            raise IdentityError("this database has no provenance identity yet: run `provmark identity init` "
                                "once, on an admin machine with the deployment's master key")
        identity = create_identity(store, seal, new_records(seal, development_ca, home), actor)
    problems = home_conflicts(home, identity)
    if problems:
        raise IdentityError("; ".join(problems) + ": this replica would serve with another identity than the "
                            "database's; move those files away (the database's identity is the deployment's)")
    return identity


def current_private(store: Store, seal: IdentitySeal, role: str) -> tuple[Ed25519PrivateKey, KeyRecord]:
    """The private key of ``role``'s current key, opened (for the services that sign with it)."""
    identity = load_identity(store, seal)
    record = identity.current(role) if identity is not None else None
    if record is None:
        raise IdentityError(f"this database has no {role} key: run `provmark identity init`")
    return seal.open(record), record


def current_kid(session: Session, role: str) -> str | None:
    """The ``kid`` of ``role``'s current key as stored now (not authenticated: compared, never trusted)."""
    return session.scalar(select(SigningKeyRow.kid).where(SigningKeyRow.role == role,
                                                          SigningKeyRow.retired_at.is_(None)).limit(1))


def rotate_receipt_key(store: Store, seal: IdentitySeal, actor: str) -> tuple[dict, dict]:
    """A new current receipt key; the old one is retired now, its private part erased, its public key kept
    in the JWKS with ``retired_at``. Returns the (old, new) public JWKs."""
    with store.write() as session:
        lock_chain(session)  # receipts are stored under this lock: none lands between the check and the swap
        identity = read_identity(session, seal)
        if identity is None:
            raise IdentityError("this database has no provenance identity yet: run `provmark identity init`")
        old = identity.current(RECEIPT)
        now = iso_utc(utc_now())
        row = session.scalar(select(SigningKeyRow).where(SigningKeyRow.role == RECEIPT,
                                                         SigningKeyRow.kid == old.kid,
                                                         SigningKeyRow.retired_at.is_(None)))
        retired = seal.signed(replace(old, retired_at=now, sealed=None))
        row.retired_at, row.sealed, row.mac = retired.retired_at, None, retired.mac
        new = seal.new(RECEIPT, Ed25519PrivateKey.generate(), now)
        session.add(_row(new))
        append_event(session, ROTATE_EVENT, actor, new.kid, {"retired_kid": old.kid, "kid": new.kid})
    return retired.jwk(), new.jwk()


def replace_certificate(store: Store, seal: IdentitySeal, record: KeyRecord, certificate: str) -> KeyRecord:
    """``record`` (a current C2PA key) with a re-issued certificate, stored."""
    renewed = seal.signed(replace(record, certificate=certificate))
    with store.write() as session:
        row = session.scalar(select(SigningKeyRow).where(SigningKeyRow.role == record.role,
                                                         SigningKeyRow.kid == record.kid,
                                                         SigningKeyRow.retired_at.is_(None)))
        if row is None:
            raise IdentityError(f"the {record.role} key {record.kid} is no longer current")
        row.certificate, row.mac = renewed.certificate, renewed.mac
    return renewed


class IdentityCache:
    """The public identity as this process last read it, re-read at most every ``refresh_s`` seconds: a
    rotation reaches every replica's JWKS within that bound. ``get()`` is None while none exists."""

    __slots__ = ("_at", "_identity", "_lock", "refresh_s", "seal", "store")

    def __init__(self, store: Store, seal: IdentitySeal, refresh_s: float = REFRESH_S):
        self.store, self.seal, self.refresh_s = store, seal, refresh_s
        self._identity: PublicIdentity | None = None
        self._at = float("-inf")
        self._lock = threading.Lock()

    def get(self) -> PublicIdentity | None:
        if time.monotonic() - self._at >= self.refresh_s:
            with self._lock:
                if time.monotonic() - self._at >= self.refresh_s:
                    self._identity = load_identity(self.store, self.seal)
                    # none yet: asked again next time (it is made once, and should show at once)
                    self._at = time.monotonic() if self._identity is not None else float("-inf")
        return self._identity

    def require(self) -> PublicIdentity:
        identity = self.get()
        if identity is None:
            raise IdentityMissing("this database has no provenance identity yet: run `provmark identity init`")
        return identity

