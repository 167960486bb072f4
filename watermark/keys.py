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

Spec binding (issue #17): a key watermarks with one spec, recorded in its public metadata (``spec``,
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

import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from watermark.paths import provmark_home

MASTER_KEY_ENV = "PROVMARK_MASTER_KEY"
KEYRING_FILE = "keyring.json"
LOCK_FILE = "keyring.lock"
MASTER_KEY_FILE = "master.key"
FORMAT = "provmark-keyring/1"
SECRET_BYTES = 32  # a 256-bit PRF key (ARCHITECTURE.md, "The PRF contract")
MASTER_KEY_BYTES = 32  # AES-256 and HMAC-SHA256 strength
NONCE_BYTES = 12  # AES-GCM's 96-bit nonce (NIST SP 800-38D, 8.2.2 random construction)
FINGERPRINT_HEX = 16  # 64 bits: tells keys apart, says nothing usable about the secret
PRIVATE_MODE = 0o600
KEY_ID_RULE = "[a-z0-9][a-z0-9_-]{0,31}"
_KEY_ID_RE = re.compile(KEY_ID_RULE)

ACTIVE, STANDBY, ROTATED, RETIRED = "active", "standby", "rotated", "retired"
STATUSES = (ACTIVE, STANDBY, ROTATED, RETIRED)
DETECTION_STATUSES = frozenset({ACTIVE, STANDBY, ROTATED})


class KeyringError(Exception):
    """Any keyring failure. Messages never contain secret material."""


class KeyNotFoundError(KeyringError, KeyError):
    """No usable key under that id (or no active key)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class KeyExistsError(KeyringError):
    """A key id is already taken (ids are never reused: verdicts refer to them)."""


class InvalidKeyIdError(KeyringError, ValueError):
    """A key id that does not match ``KEY_ID_RULE``."""


class KeyStateError(KeyringError):
    """The operation does not fit the key's status (e.g. retiring the active key)."""


class MasterKeyError(KeyringError):
    """The master key is missing, malformed or stored unsafely."""


class KeyringIntegrityError(KeyringError):
    """The keyring file was edited, truncated or reordered outside provmark."""


class WrongMasterKeyError(KeyringIntegrityError):
    """The master key given is not the one that sealed this keyring."""


class KeySpecError(KeyringError, ValueError):
    """A key was asked for under a spec other than the one it is bound to (or an hf spec, which has no key)."""


@dataclass(slots=True, frozen=True)
class KeyInfo:
    """Public facts about one key; deliberately has no secret field."""

    key_id: str
    status: str
    created_at: str  # ISO 8601 UTC, e.g. 2025-01-31T12:00:00Z
    retired_at: str | None
    fingerprint: str  # first 16 hex of HMAC-SHA256(secret, "provmark/key-fingerprint")
    purged: bool = False  # retired and its secret erased
    spec: str | None = None  # the canonical kgw spec it watermarks with; None: made before specs were recorded

    @property
    def used_for_detection(self) -> bool:
        return self.status in DETECTION_STATUSES

    @property
    def usable_for_generation(self) -> bool:
        return self.status in (ACTIVE, STANDBY)

    def to_dict(self) -> dict:
        return asdict(self)

    def sealed_fields(self) -> dict:
        """The metadata sealed with the secret; ``spec`` only when recorded, so keys made before it
        existed keep their original associated data and MAC."""
        out = asdict(self)
        if out["spec"] is None:
            del out["spec"]
        return out


def new_secret() -> bytes:
    """A fresh key secret: SECRET_BYTES from the operating system's CSPRNG."""
    return secrets.token_bytes(SECRET_BYTES)


def key_fingerprint(secret: bytes) -> str:
    """Public, non-reversible short name of a secret so users can tell keys apart."""
    return hmac.new(secret, b"provmark/key-fingerprint", hashlib.sha256).hexdigest()[:FINGERPRINT_HEX]


def parse_master_key(text: str, source: str = MASTER_KEY_ENV) -> bytes:
    """32 bytes from 64 hex digits or 43 base64url characters; the error never echoes the value."""
    text = text.strip()
    if re.fullmatch(r"[0-9a-fA-F]{64}", text):
        return bytes.fromhex(text)
    if re.fullmatch(r"[A-Za-z0-9_-]{43}=?", text):
        return base64.urlsafe_b64decode(text[:43] + "=")
    raise MasterKeyError(
        f"{source} is malformed: expected {MASTER_KEY_BYTES} bytes as 64 hex digits or 43 base64url "
        f"characters (got {len(text)} characters)"
    )


def format_master_key(master_key: bytes) -> str:
    """The text form written to ``master.key`` (base64url, no padding)."""
    return base64.urlsafe_b64encode(master_key).decode().rstrip("=")


def _hkdf(master_key: bytes, purpose: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose).derive(master_key)


class _MasterKeys:
    """Subkeys derived from the master key, one per purpose so none is used twice."""

    __slots__ = ("_master_key", "aead", "check", "mac_key", "source")

    def __init__(self, master_key: bytes, source: str):
        self._master_key = master_key
        self.aead = AESGCM(_hkdf(master_key, b"provmark/keyring/aes-gcm"))
        self.mac_key = _hkdf(master_key, b"provmark/keyring/file-mac")
        self.check = _hkdf(master_key, b"provmark/keyring/master-check").hex()[:FINGERPRINT_HEX]
        self.source = source

    def __repr__(self) -> str:
        return f"<master key from {self.source}>"

    def derive(self, purpose: bytes) -> bytes:
        if purpose.startswith(b"provmark/keyring/"):
            raise ValueError("purpose: the provmark/keyring/ labels are the keyring's own")
        return _hkdf(self._master_key, purpose)


@dataclass(slots=True)
class _Entry:
    """One stored key: public info + its sealed secret (None once purged)."""

    info: KeyInfo
    nonce: str | None
    ciphertext: str | None


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _associated_data(info: KeyInfo) -> bytes:
    return _canonical({"format": FORMAT, **info.sealed_fields()})


def _seal(keys: _MasterKeys, info: KeyInfo, secret: bytes) -> _Entry:
    nonce = secrets.token_bytes(NONCE_BYTES)
    return _Entry(info, _b64(nonce), _b64(keys.aead.encrypt(nonce, secret, _associated_data(info))))


def _open(keys: _MasterKeys, entry: _Entry) -> bytes:
    key_id = entry.info.key_id
    if entry.info.purged or entry.nonce is None or entry.ciphertext is None:
        raise KeyNotFoundError(f"key {key_id} was retired with purge: its secret no longer exists")
    try:
        secret = keys.aead.decrypt(
            base64.b64decode(entry.nonce, validate=True),
            base64.b64decode(entry.ciphertext, validate=True),
            _associated_data(entry.info),
        )
    except (InvalidTag, ValueError) as exc:
        raise KeyringIntegrityError(
            f"key {key_id}: sealed secret does not match its metadata (file tampered)"
        ) from exc
    if len(secret) != SECRET_BYTES or key_fingerprint(secret) != entry.info.fingerprint:
        raise KeyringIntegrityError(f"key {key_id}: secret does not match its fingerprint (file tampered)")
    return secret


def _document_body(entries: list[_Entry], keys: _MasterKeys) -> dict:
    return {
        "format": FORMAT,
        "master_key_check": keys.check,
        "entries": [{**e.info.sealed_fields(), "nonce": e.nonce, "ciphertext": e.ciphertext} for e in entries],
    }


def _document_mac(body: dict, mac_key: bytes) -> str:
    return hmac.new(mac_key, _canonical(body), hashlib.sha256).hexdigest()


def _parse_entry(raw: dict) -> _Entry:
    fields = ("key_id", "status", "created_at", "retired_at", "fingerprint", "purged")
    if not isinstance(raw, dict) or set(raw) - {"spec"} != {*fields, "nonce", "ciphertext"}:
        raise KeyringIntegrityError("keyring file has a malformed entry")
    if not (raw.get("spec") is None or isinstance(raw["spec"], str)):
        raise KeyringIntegrityError("keyring file has an entry with an invalid spec")
    info = KeyInfo(**{name: raw[name] for name in fields}, spec=raw.get("spec"))
    valid_id = isinstance(info.key_id, str) and _KEY_ID_RE.fullmatch(info.key_id)
    if not valid_id or info.status not in STATUSES:
        raise KeyringIntegrityError("keyring file has an entry with an invalid id or status")
    return _Entry(info, raw["nonce"], raw["ciphertext"])


def _parse_document(data: bytes, keys: _MasterKeys, path: Path) -> list[_Entry]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise KeyringIntegrityError(f"{path} is not valid JSON (damaged or edited)") from exc
    if not isinstance(doc, dict) or set(doc) != {"format", "master_key_check", "entries", "mac"}:
        raise KeyringIntegrityError(f"{path} is not a provmark keyring")
    if doc["format"] != FORMAT:
        raise KeyringIntegrityError(f"{path} has unknown format {str(doc['format'])[:40]!r}")
    if not hmac.compare_digest(str(doc["master_key_check"]), keys.check):
        raise WrongMasterKeyError(
            f"the master key from {keys.source} does not open {path} (wrong master key)"
        )
    body = {name: doc[name] for name in ("format", "master_key_check", "entries")}
    if not hmac.compare_digest(str(doc["mac"]), _document_mac(body, keys.mac_key)):
        raise KeyringIntegrityError(
            f"{path} failed authentication: entries were edited, removed or reordered"
        )
    if not isinstance(doc["entries"], list):
        raise KeyringIntegrityError(f"{path} is not a provmark keyring")
    entries = [_parse_entry(raw) for raw in doc["entries"]]
    for entry in entries:
        if not entry.info.purged:
            _open(keys, entry)  # proves every sealed secret still matches its metadata
    duplicate_ids = len({e.info.key_id for e in entries}) != len(entries)
    if duplicate_ids or sum(e.info.status == ACTIVE for e in entries) > 1:
        raise KeyringIntegrityError(f"{path} has duplicate ids or several active keys")
    return entries


def write_private_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: a 0600 temp file, fsync, rename, fsync of the folder."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), PRIVATE_MODE)  # in case a strange umask removed owner bits
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def validate_key_id(key_id: str) -> str:
    """The id itself, or InvalidKeyIdError (which does not echo the bad value: it may be a pasted secret)."""
    if not isinstance(key_id, str) or not _KEY_ID_RE.fullmatch(key_id):
        raise InvalidKeyIdError(
            f"invalid key id: it must match {KEY_ID_RULE} (lowercase, at most 32 characters)"
        )
    return key_id


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
        self._keys: _MasterKeys | None = None

    def __repr__(self) -> str:
        return f"Keyring(home={str(self.home)!r})"

    @property
    def path(self) -> Path:
        return self.home / KEYRING_FILE

    # --- public operations -------------------------------------------------------------------

    def create(self, key_id: str | None = None, secret: bytes | None = None, spec=None) -> KeyInfo:
        """A new key: ``active`` when no key is active (the first one), otherwise ``standby``.

        ``secret``: a fresh secret from ``new_secret()`` chosen by the caller (key screening draws a
        few and keeps one whose measured null is sound); default: drawn here. ``spec``: the kgw spec
        (string or WatermarkSpec) the key is bound to; default: the default spec."""
        with self._transaction() as entries:
            status = STANDBY if any(e.info.status == ACTIVE for e in entries) else ACTIVE
            return self._add(entries, key_id, status, secret, spec)

    def rotate(self, new_key_id: str | None = None, secret: bytes | None = None, spec=None) -> KeyInfo:
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
                return self._add(entries, new_key_id, ACTIVE, secret, spec)
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
                entries[i] = _Entry(retired, None, None)
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
        return _open(self._master_keys(create=False), entries[_find(entries, key_id)])

    def ensure_active(self, secret: bytes | None = None) -> KeyInfo:
        """The active key, creating a first one (from ``secret`` when given) when there is none."""
        with self._transaction() as entries:
            for entry in entries:
                if entry.info.status == ACTIVE:
                    return entry.info
            return self._add(entries, None, ACTIVE, secret)

    # --- storage -------------------------------------------------------------------------------

    def _add(self, entries: list[_Entry], key_id: str | None, status: str, secret: bytes | None = None,
             spec=None) -> KeyInfo:
        from watermark.key_binding import spec_to_bind

        bound = spec_to_bind(spec)  # checked before anything is drawn or written
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
        info = KeyInfo(key_id, status, _now(), None, key_fingerprint(secret), spec=bound)
        entries.append(_seal(self._master_keys(create=True), info, secret))
        return info

    def derive_key(self, purpose: bytes) -> bytes:
        """A 32-byte key for another secret kept at rest (e.g. the receipt signing key), derived
        from the master key with HKDF under its own ``purpose`` label; creates the master key on
        first use like any keyring write."""
        return self._master_keys(create=True).derive(purpose)

    def _restatus(self, entry: _Entry, **changes) -> _Entry:
        keys = self._master_keys(create=True)
        return _seal(keys, replace(entry.info, **changes), _open(keys, entry))  # new metadata -> new AD

    def _master_keys(self, create: bool) -> _MasterKeys | None:
        if self._keys is None:
            if self._given_master_key is not None:
                self._keys = _MasterKeys(self._given_master_key, "Keyring(master_key=...)")
            elif os.environ.get(MASTER_KEY_ENV):
                self._keys = _MasterKeys(parse_master_key(os.environ[MASTER_KEY_ENV]), MASTER_KEY_ENV)
            else:
                master_key = self._master_key_from_file(create)
                if master_key is not None:
                    self._keys = _MasterKeys(master_key, str(self.home / MASTER_KEY_FILE))
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
            _fsync_dir(self.home)
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

    def _load(self) -> list[_Entry]:
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
        return _parse_document(data, keys, self.path)

    def _read(self) -> list[_Entry]:
        with self._locked(exclusive=False):
            return self._load()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[list[_Entry]]:
        """Read, let the caller change the entry list, write it back if changed; all under the lock."""
        with self._locked(exclusive=True):
            entries = self._load()
            before = list(entries)
            yield entries
            if entries != before:
                keys = self._master_keys(create=True)
                body = _document_body(entries, keys)
                document = {**body, "mac": _document_mac(body, keys.mac_key)}
                write_private_atomic(self.path, json.dumps(document, indent=2).encode() + b"\n")


def _find(entries: list[_Entry], key_id: str) -> int:
    if not isinstance(key_id, str) or not _KEY_ID_RE.fullmatch(key_id):
        raise KeyNotFoundError(f"no such key: key ids match {KEY_ID_RULE}")
    for i, entry in enumerate(entries):
        if entry.info.key_id == key_id:
            return i
    raise KeyNotFoundError(f"no key {key_id} in the keyring (see `provmark keys list`)")
