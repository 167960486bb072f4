"""The keyring: public key ids -> 32-byte watermark secrets, encrypted at rest.

Files under ``PROVMARK_HOME`` (all mode 0600):
  ``keyring.json``  one entry per key: public metadata + the AES-GCM ciphertext of its secret
  ``keyring.lock``  ``flock`` target that serialises writers across processes
  ``master.key``    the generated master key, only when ``PROVMARK_MASTER_KEY`` is unset

Master key: ``PROVMARK_MASTER_KEY`` holds 32 bytes written as 64 hex digits or as 43 base64url
characters (a trailing ``=`` is allowed), e.g.
``python -c "import secrets; print(secrets.token_urlsafe(32))"``.
It wins over ``master.key``. When it is unset, ``master.key`` is generated (same base64url text) on the
first write. A keyring that exists without its master key is an error, never silently replaced.

Lifecycle (``status``):
  ``active``   the default key for new text; also used for detection. After the first ``create`` there
               is always exactly one active key.
  ``standby``  made by ``create`` while another key is active: used for detection (so detectors can be
               given a key before generation switches to it); ``rotate(<its id>)`` makes it active.
  ``rotated``  a former active key: still used for detection, no longer the default for new text.
  ``retired``  no longer used for detection. The secret is kept for audits of old verdicts unless
               ``purge=True`` erases it for good. The active key cannot be retired: rotate first.

Spec binding: a key watermarks with one spec, recorded in its public metadata (``spec``,
canonical string; keys made before this field existed are bound to the default spec). The detector
scores a key only under a spec with the same colours (``watermark.key_binding``), so a caller cannot
query the key under another scheme, h or gamma to learn its green lists.

Integrity: each secret is sealed with AES-256-GCM whose associated data binds every metadata field
(id, status, times, fingerprint), and the whole entry list carries an HMAC-SHA256; both keys are
derived from the master key with HKDF. A wrong master key, an edited field, a deleted, reordered or
swapped entry raise ``KeyringIntegrityError``. Not detected: replacing the whole file with an older
copy made by provmark itself, or deleting it (the keyring then reads as empty).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from watermark import key_binding
from watermark.key_info import (
    ACTIVE,
    KEY_ID_RE,
    KEY_ID_RULE,
    RETIRED,
    ROTATED,
    SECRET_BYTES,
    STANDBY,
    KeyExistsError,
    KeyInfo,
    KeyNotFoundError,
    KeyringError,
    KeyStateError,
    MasterKeyError,
    key_fingerprint,
    new_secret,
    validate_key_id,
)
from watermark.keyring_seal import (
    MASTER_KEY_BYTES,
    MASTER_KEY_ENV,
    MasterKeys,
    SealedEntry,
    document_body,
    document_mac,
    format_master_key,
    open_secret,
    parse_document,
    parse_master_key,
    seal,
)
from watermark.paths import PRIVATE_MODE, fsync_dir, provmark_home, write_private_atomic
from watermark.public_key import public_half_secret, require_two_part_spec

KEYRING_FILE = "keyring.json"
LOCK_FILE = "keyring.lock"
MASTER_KEY_FILE = "master.key"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")



class Keyring:
    """Key ids -> secrets, stored encrypted in ``home/keyring.json``.

    Every call re-reads the file (other processes may have changed it); writes hold an exclusive
    ``flock`` on ``keyring.lock`` from read to atomic rename, so concurrent writers never lose keys.
    """

    __slots__ = ("_given_master_key", "_keys", "home")

    def __init__(self, home: Path | None = None, master_key: bytes | None = None):
        if master_key is not None and (
            not isinstance(master_key, bytes) or len(master_key) != MASTER_KEY_BYTES
        ):
            raise MasterKeyError(f"master_key must be {MASTER_KEY_BYTES} bytes")
        self.home = Path(home).expanduser() if home is not None else provmark_home()
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._given_master_key = master_key
        self._keys: MasterKeys | None = None

    def __repr__(self) -> str:
        return f"Keyring(home={str(self.home)!r})"

    @property
    def path(self) -> Path:
        return self.home / KEYRING_FILE

    # --- public operations -------------------------------------------------------------------

    def create(self, key_id: str | None = None, secret: bytes | None = None, spec=None,
               public_half: bool = False) -> KeyInfo:
        """A new key: ``active`` when no key is active (the first one), otherwise ``standby``.

        ``secret``: a fresh secret from ``new_secret()`` chosen by the caller (key screening draws a
        few and keeps one whose measured null is sound); default: drawn here. ``spec``: the kgw spec
        (string or WatermarkSpec) the key is bound to; default: the default spec. ``public_half``: a
        two-part key whose detection half may be published (``watermark.public_key``; kgw specs only)."""
        with self._transaction() as entries:
            status = STANDBY if any(e.info.status == ACTIVE for e in entries) else ACTIVE
            return self._add(entries, key_id, status, secret, spec, public_half)

    def public_half(self, key_id: str) -> bytes:
        """The detection half of a two-part key (derived from its secret, safe to publish); KeyStateError
        for a one-part key, whose every colour is secret."""
        entries = self._read()
        entry = entries[_find(entries, key_id)]
        if not entry.info.public_half:
            raise KeyStateError(f"key {key_id} has no public half (create one with `provmark keys create "
                                "--public-half`)")
        return public_half_secret(open_secret(self._master_keys(create=False), entry))

    def rotate(self, new_key_id: str | None = None, secret: bytes | None = None, spec=None,
               public_half: bool = False) -> KeyInfo:
        """Make a new key (or the named standby key) active; the previous active key becomes ``rotated``."""
        with self._transaction() as entries:
            target = None
            if new_key_id is not None and any(e.info.key_id == new_key_id for e in entries):
                target = _find(entries, new_key_id)
                if entries[target].info.status != STANDBY:
                    status = entries[target].info.status
                    raise KeyStateError(
                        f"key {new_key_id} is {status}; rotate to a new id or to a standby key"
                    )
            for i, entry in enumerate(entries):
                if entry.info.status == ACTIVE:
                    entries[i] = self._restatus(entry, status=ROTATED)
            if target is None:
                return self._add(entries, new_key_id, ACTIVE, secret, spec, public_half)
            entries[target] = self._restatus(entries[target], status=ACTIVE)
            return entries[target].info

    def retire(self, key_id: str, purge: bool = False) -> KeyInfo:
        """Stop using a key for detection. ``purge=True`` also erases its secret (irreversible).

        Refuses the active key (KeyStateError): rotate first, so new text never goes unwatermarked.
        Retiring a retired key again is a no-op (or only purges it).
        """
        with self._transaction() as entries:
            i = _find(entries, key_id)
            info = entries[i].info
            if info.status == ACTIVE:
                raise KeyStateError(
                    f"key {key_id} is the active key: run `provmark keys rotate` first so new text uses "
                    "another key, then retire it"
                )
            if info.status == RETIRED and (info.purged or not purge):
                return info
            if purge:
                retired = replace(info, status=RETIRED, retired_at=info.retired_at or _now(), purged=True)
                entries[i] = SealedEntry(retired, None, None)
            else:
                entries[i] = self._restatus(entries[i], status=RETIRED, retired_at=_now())
            return entries[i].info

    def list(self) -> list[KeyInfo]:
        """Every key, oldest first."""
        return [e.info for e in self._read()]

    def active(self) -> KeyInfo:
        """The key new text is watermarked with."""
        for entry in self._read():
            if entry.info.status == ACTIVE:
                return entry.info
        raise KeyNotFoundError("no active watermark key: create one with `provmark keys create`")

    def detection_keys(self) -> list[KeyInfo]:
        """Keys detection should test: the active key first, then standby and rotated keys, newest first."""
        infos = [e.info for e in reversed(self._read()) if e.info.used_for_detection]
        return sorted(infos, key=lambda info: info.status != ACTIVE)  # stable: keeps newest-first

    def secret(self, key_id: str) -> bytes:
        """The 32-byte secret of any non-purged key (retired ones included, for audits)."""
        entries = self._read()
        return open_secret(self._master_keys(create=False), entries[_find(entries, key_id)])

    def ensure_active(self, secret: bytes | None = None) -> KeyInfo:
        """The active key, creating a first one (from ``secret`` when given) when there is none."""
        with self._transaction() as entries:
            for entry in entries:
                if entry.info.status == ACTIVE:
                    return entry.info
            return self._add(entries, None, ACTIVE, secret)

    # --- storage -------------------------------------------------------------------------------

    def _add(self, entries: list[SealedEntry], key_id: str | None, status: str, secret: bytes | None = None,
             spec=None, public_half: bool = False) -> KeyInfo:
        bound = key_binding.spec_to_bind(spec)  # checked before anything is drawn or written
        if public_half:
            require_two_part_spec(bound)
        taken = {e.info.key_id for e in entries}
        if key_id is None:
            key_id = next(k for k in iter(lambda: f"k-{secrets.token_hex(4)}", None) if k not in taken)
        elif validate_key_id(key_id) in taken:
            raise KeyExistsError(f"key {key_id} already exists (key ids are never reused)")
        if secret is None:
            secret = new_secret()
        elif not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
            raise KeyringError(f"a key secret is {SECRET_BYTES} random bytes")
        elif any(e.info.fingerprint == key_fingerprint(secret) for e in entries):
            raise KeyExistsError("that secret is already in the keyring")
        info = KeyInfo(key_id, status, _now(), None, key_fingerprint(secret), spec=bound, public_half=bool(public_half))
        entries.append(seal(self._master_keys(create=True), info, secret))
        return info

    def derive_key(self, purpose: bytes) -> bytes:
        """A 32-byte key for another secret kept at rest (e.g. the receipt signing key), derived
        from the master key with HKDF under its own ``purpose`` label; creates the master key on
        first use like any keyring write."""
        return self._master_keys(create=True).derive(purpose)

    def derive_existing_key(self, purpose: bytes) -> bytes:
        """``derive_key`` without creating anything: MasterKeyError when there is no master key."""
        keys = self._master_keys(create=False)
        if keys is None:
            raise MasterKeyError(f"there is no master key: set {MASTER_KEY_ENV} (or put {MASTER_KEY_FILE} in "
                                 f"{self.home})")
        return keys.derive(purpose)

    def _restatus(self, entry: SealedEntry, **changes) -> SealedEntry:
        keys = self._master_keys(create=True)
        return seal(keys, replace(entry.info, **changes), open_secret(keys, entry))  # new metadata -> new AD

    def _master_keys(self, create: bool) -> MasterKeys | None:
        if self._keys is None:
            if self._given_master_key is not None:
                self._keys = MasterKeys(self._given_master_key, "Keyring(master_key=...)")
            elif os.environ.get(MASTER_KEY_ENV):
                self._keys = MasterKeys(parse_master_key(os.environ[MASTER_KEY_ENV]), MASTER_KEY_ENV)
            else:
                master_key = self._master_key_from_file(create)
                if master_key is not None:
                    self._keys = MasterKeys(master_key, str(self.home / MASTER_KEY_FILE))
        return self._keys

    def _master_key_from_file(self, create: bool) -> bytes | None:
        path = self.home / MASTER_KEY_FILE
        if not path.exists():
            if not create:
                return None
            master_key = secrets.token_bytes(MASTER_KEY_BYTES)
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)  # 0600 from the first byte
            try:
                with os.fdopen(fd, "w") as f:
                    os.fchmod(f.fileno(), PRIVATE_MODE)
                    f.write(format_master_key(master_key) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
                with contextlib.suppress(FileExistsError):  # another process won the race: use its key
                    os.link(tmp, path)  # appears complete or not at all, never overwrites
            finally:
                tmp.unlink(missing_ok=True)
            fsync_dir(self.home)
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise MasterKeyError(
                f"{path} is readable by other users (mode {mode:04o}): run `chmod 600 {path}`"
            )
        return parse_master_key(path.read_text(), str(path))

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        fd = os.open(self.home / LOCK_FILE, os.O_RDWR | os.O_CREAT, PRIVATE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _load(self) -> list[SealedEntry]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        keys = self._master_keys(create=False)
        if keys is None:
            raise MasterKeyError(
                f"{self.path} exists but its master key is missing: set {MASTER_KEY_ENV} or restore "
                f"{self.home / MASTER_KEY_FILE}"
            )
        return parse_document(data, keys, self.path)

    def _read(self) -> list[SealedEntry]:
        with self._locked(exclusive=False):
            return self._load()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[list[SealedEntry]]:
        """Read, let the caller change the entry list, write it back if changed; all under the lock."""
        with self._locked(exclusive=True):
            entries = self._load()
            before = list(entries)
            yield entries
            if entries != before:
                keys = self._master_keys(create=True)
                body = document_body(entries, keys)
                document = {**body, "mac": document_mac(body, keys.mac_key)}
                write_private_atomic(self.path, json.dumps(document, indent=2).encode() + b"\n")


def _find(entries: list[SealedEntry], key_id: str) -> int:
    if not isinstance(key_id, str) or not KEY_ID_RE.fullmatch(key_id):
        raise KeyNotFoundError(f"no such key: key ids match {KEY_ID_RULE}")
    for i, entry in enumerate(entries):
        if entry.info.key_id == key_id:
            return i
    raise KeyNotFoundError(f"no key {key_id} in the keyring (see `provmark keys list`)")

