"""API tokens: created once, stored as SHA-256 only, checked in constant time, scoped, revocable.

A token is ``pmk_`` + 43 base64url characters of 256 random bits. The store keeps SHA-256(token):
a fast hash is enough because the input is a uniformly random 256-bit value, not a password, so there
is nothing to guess and no need for a slow KDF; a stolen database yields no usable token.

Scopes: ``generate``, ``detect``, ``explain``, ``audit``, ``admin``; ``admin`` grants every scope.
Creating and revoking tokens append ``token.create`` / ``token.revoke`` audit events in the same
transaction. ``ensure_admin_token`` bootstraps the first admin token into ``$PROVMARK_HOME/admin.token``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import select

from db.audit import append_event, lock_chain
from db.caller import Caller
from db.rows import ApiTokenRow, iso_utc, new_id, utc_now
from db.store import Store
from watermark.paths import (
    provmark_home,
    write_private_atomic,  # one atomic 0600 writer for the project
)

TOKEN_PREFIX = "pmk_"
TOKEN_BYTES = 32  # 256 bits: unguessable, so SHA-256 storage is adequate (see module docstring)
SCOPES = ("generate", "detect", "explain", "audit", "admin")
ADMIN = "admin"
ADMIN_TOKEN_FILE = "admin.token"
BOOTSTRAP_NAME = "bootstrap-admin"
NAME_RULE = r"[A-Za-z0-9][A-Za-z0-9 ._@-]{0,99}"
_NAME_RE = re.compile(NAME_RULE)
_TOKEN_RE = re.compile(re.escape(TOKEN_PREFIX) + r"[A-Za-z0-9_-]{43}")


class TokenError(Exception):
    """Bad token request (unknown scope, bad name, unknown id). Never contains a token."""


class ScopeError(PermissionError):
    """An authenticated token lacks the scope an operation needs (services answer 403)."""


@dataclass(slots=True, frozen=True)
class TokenInfo:
    """Public facts about a token; deliberately has neither the token nor its hash."""

    token_id: str
    name: str
    scopes: frozenset[str]
    created_at: str
    revoked_at: str | None

    @property
    def caller(self) -> Caller:
        return Caller(name=self.name, token_id=self.token_id)

    def allows(self, scope: str) -> bool:
        return scope in self.scopes or ADMIN in self.scopes

    def to_dict(self) -> dict:
        return {"token_id": self.token_id, "name": self.name, "scopes": sorted(self.scopes),
                "created_at": self.created_at, "revoked_at": self.revoked_at}


def token_hash(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def parse_scopes(scopes) -> frozenset[str]:
    """A set of known scopes from an iterable or a comma/space-separated string; TokenError otherwise."""
    if isinstance(scopes, str):
        scopes = re.split(r"[,\s]+", scopes.strip())
    chosen = frozenset(s for s in scopes if s)
    unknown = chosen - set(SCOPES)
    if not chosen or unknown:
        raise TokenError(f"scopes must be a non-empty subset of {', '.join(SCOPES)}"
                         + (f" (unknown: {', '.join(sorted(unknown))})" if unknown else ""))
    return chosen


def create_token(store: Store, scopes, name: str, actor: str = "cli") -> tuple[str, str]:
    """A new token: returns (token_id, plaintext). The plaintext is not stored and cannot be shown again."""
    with store.write() as session:
        return _create(session, parse_scopes(scopes), _valid_name(name), actor)


def authenticate(store: Store, plaintext: str) -> TokenInfo | None:
    """The token's info if ``plaintext`` is a live (not revoked) token, else None."""
    if not isinstance(plaintext, str) or not _TOKEN_RE.fullmatch(plaintext):
        return None
    digest = token_hash(plaintext)
    with store.read() as session:
        row = session.scalar(select(ApiTokenRow).where(ApiTokenRow.token_hash == digest))
    # The lookup finds the row by hash; compare_digest re-checks without a data-dependent early exit.
    if row is None or not hmac.compare_digest(row.token_hash, digest) or row.revoked_at is not None:
        return None
    return _info(row)


def require_scope(info: TokenInfo | None, scope: str) -> TokenInfo:
    """``info`` when it grants ``scope``; ScopeError otherwise (also for a missing token)."""
    if scope not in SCOPES:
        raise TokenError(f"unknown scope {scope!r}: scopes are {', '.join(SCOPES)}")
    if info is None or not info.allows(scope):
        raise ScopeError(f"this operation needs the {scope!r} scope")
    return info


def revoke_token(store: Store, token_id: str, actor: str = "cli") -> TokenInfo:
    """Revoke a token for good (idempotent); TokenError for an unknown id."""
    with store.write() as session:
        row = session.get(ApiTokenRow, token_id, with_for_update=True)
        if row is None:
            raise TokenError(f"no token with id {token_id[:40]!r}")
        if row.revoked_at is None:
            row.revoked_at = utc_now()
            append_event(session, "token.revoke", actor, row.token_id, {"name": row.name})
        return _info(row)


def list_tokens(store: Store) -> list[TokenInfo]:
    """Every token, oldest first (revoked ones included)."""
    with store.read() as session:
        rows = session.scalars(select(ApiTokenRow).order_by(ApiTokenRow.created_at, ApiTokenRow.token_id))
        return [_info(row) for row in rows]


def ensure_admin_token(home: Path | None = None, store: Store | None = None) -> str | None:
    """On first start: create an admin token, write it to ``home/admin.token`` (0600) and return it.

    Returns None when a live admin token already exists. Safe when several workers start at once.
    """
    home = Path(home).expanduser() if home is not None else provmark_home()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    own_store = store is None
    store = store or Store(home=home)
    try:
        with store.write() as session:
            lock_chain(session)  # serialises the check and the create across workers
            live = session.scalars(select(ApiTokenRow.scopes).where(ApiTokenRow.revoked_at.is_(None)))
            if any(ADMIN in scopes.split() for scopes in live):
                return None
            _, plaintext = _create(session, frozenset({ADMIN}), BOOTSTRAP_NAME, "bootstrap")
            # Written before commit: a failed commit leaves a dead file, never a live token nobody saw.
            write_private_atomic(home / ADMIN_TOKEN_FILE, (plaintext + "\n").encode())
            return plaintext
    finally:
        if own_store:
            store.close()


def announce_admin_token(service: str, token: str, path: Path, stream=None) -> None:
    """Tell the operator a bootstrap admin token exists. The token itself is shown only on an
    interactive terminal: a service's stderr is usually a log (systemd, docker, a file), and a token in a
    log is a token for whoever reads logs. Elsewhere the line names the 0600 file that holds it."""
    stream = stream if stream is not None else sys.stderr
    if stream.isatty():
        print(f"provmark {service}: bootstrap admin token {token} (shown once; also in {path}, mode 0600)",
              file=stream, flush=True)
    else:
        print(f"provmark {service}: a bootstrap admin token was written to {path} (mode 0600; "
              f"not printed, as this output is not a terminal)", file=stream, flush=True)


def _create(session, scopes: frozenset[str], name: str, actor: str) -> tuple[str, str]:
    token_id, plaintext = new_id(), TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)
    session.add(ApiTokenRow(token_id=token_id, name=name, token_hash=token_hash(plaintext),
                            scopes=" ".join(sorted(scopes)), created_at=utc_now(), revoked_at=None))
    session.flush()
    append_event(session, "token.create", actor, token_id, {"name": name, "scopes": sorted(scopes)})
    return token_id, plaintext


def _valid_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise TokenError(f"token name must match {NAME_RULE}")
    return name


def _info(row: ApiTokenRow) -> TokenInfo:
    revoked = iso_utc(row.revoked_at) if isinstance(row.revoked_at, datetime) else None
    return TokenInfo(row.token_id, row.name, frozenset(row.scopes.split()), iso_utc(row.created_at), revoked)
