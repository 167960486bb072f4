"""The deployment's identity as the admin commands use it: signing keys opened, or the public identity
(``db.identity``), with their errors as CLIErrors."""

from __future__ import annotations

from api.cli.errors import CLIError
from api.provenance_keys import SigningKeys
from api.settings import Settings
from db.identity import load_identity, seal_of
from db.receipts import ReceiptError
from db.store import Store
from provenance.c2pa_credential import C2paCredentialError
from provenance.identity import IdentityError, PublicIdentity
from provenance.log_signer import origin_of
from watermark.key_info import KeyringError

CLI_ACTOR = "cli"


def signing_keys(store: Store, create: bool = False) -> SigningKeys:
    """The deployment's signing keys, for the admin commands that sign (rotation, log heads)."""
    try:
        return SigningKeys(Settings.load(), store, create=create, actor=CLI_ACTOR)
    except (IdentityError, ReceiptError, C2paCredentialError, KeyringError, ValueError) as error:
        raise CLIError(str(error)) from None


def public_identity(store: Store) -> PublicIdentity:
    """The deployment's identity, authenticated with this machine's master key; CLIError when there is none."""
    try:
        identity = load_identity(store, seal_of(Settings.load().home))
    except (IdentityError, KeyringError) as error:
        raise CLIError(str(error)) from None
    if identity is None:
        raise CLIError("this database has no provenance identity yet: run `provmark identity init`")
    return identity


def describe(identity: PublicIdentity) -> dict:
    log_key = identity.log_key()
    return {"deployment_id": identity.deployment_id, "log_origin": origin_of(log_key),
            "keys": [{"role": r.role, "kid": r.kid, "created_at": r.created_at, "retired_at": r.retired_at}
                     for r in identity.records]}


def optional_log_key(store: Store):
    """The deployment's log public key, or None when the database has no identity yet."""
    try:
        identity = load_identity(store, seal_of(Settings.load().home))
    except (IdentityError, KeyringError) as error:
        raise CLIError(str(error)) from None
    return identity.log_key() if identity is not None else None
