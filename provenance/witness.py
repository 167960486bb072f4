"""A witness of the transparency log: C2SP tlog-cosignature v1 (Ed25519) over the log's checkpoints, and the
witness's decision whether to cosign a new checkpoint. Pure: no files, no network, no database.

A cosignature is one more signature line of the checkpoint note::

    — <witness name> base64(key id || timestamp || signature)

    key id      SHA-256(<name> || "\\n" || 0x04 || 32-byte Ed25519 public key)[:4]
    timestamp   uint64 big-endian, POSIX seconds when the witness cosigned (at most 2^63 - 1)
    signature   Ed25519 over  "cosignature/v1\\n" "time <timestamp in decimal>\\n" <the checkpoint's body>

The body is the note's text up to and including the newline that ends its last body line (no signature
lines). The witness's verifier key is ``<name>+<8 hex key id>+<base64(0x04 || public key)>`` (C2SP signed-note).

The decision (``check_update``): the witness keeps the last checkpoint it cosigned. A new one is cosigned only
if the pinned log key signed it under the pinned origin, and it is the same tree (same size, same root) or a
consistency proof shows it extends the kept one. Otherwise a ``Refusal`` says which of ``REFUSALS`` it is.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
import time
from collections.abc import Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from provenance.log_key import raw_key
from provenance.merkle import verify_consistency
from provenance.tree_head import SIGNATURE_DASH, Checkpoint, TreeHeadError, parse_checkpoint, verify_checkpoint

COSIGNATURE_ALGORITHM = b"\x04"  # the signed-note signature type of a timestamped Ed25519 cosignature
COSIGNATURE_LABEL = b"cosignature/v1\n"
KEY_ID_BYTES, TIMESTAMP_BYTES, SIGNATURE_BYTES = 4, 8, 64
MAX_TIMESTAMP = 2**63 - 1  # the spec's bound on a cosignature's timestamp
DEFAULT_NAME_PREFIX = "provmark.witness/"
MAX_NAME_CHARS = 200

# Why a witness refuses a checkpoint (``Refusal.kind``).
MALFORMED = "malformed"  # not a checkpoint note
ORIGIN_CHANGED = "origin_changed"  # another log's name than the one pinned
LOG_SIGNATURE = "log_signature"  # not signed (or not validly) by the pinned log key
ROLLBACK = "rollback"  # a smaller tree than the witness already cosigned
FORK = "fork"  # the same size as the cosigned tree, another root
INCONSISTENT = "inconsistent"  # larger, but the consistency proof does not lead from the cosigned tree to it
KEY_CHANGED = "key_changed"  # the log key offered is not the one the witness pinned
REFUSALS = (MALFORMED, ORIGIN_CHANGED, LOG_SIGNATURE, ROLLBACK, FORK, INCONSISTENT, KEY_CHANGED)


class WitnessError(ValueError):
    """A malformed witness key, verifier key or name, or a cosignature that is missing or does not verify."""


class Refusal(Exception):
    """The witness does not cosign: ``kind`` (one of ``REFUSALS``) and a sentence saying why."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind, self.reason = kind, reason


# ---- keys and names -----------------------------------------------------------------------------------

def new_witness_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def private_key_pem(private_key: Ed25519PrivateKey) -> bytes:
    """PKCS#8 PEM, unencrypted: the file that holds it must be readable by its owner only."""
    return private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())


def load_private_key_pem(data: bytes) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise WitnessError("the witness key file is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise WitnessError("the witness key is not an Ed25519 key")
    return key


def check_name(name: str) -> str:
    """``name`` if it can name a note signer: non-empty, no whitespace, no '+'; else WitnessError."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS or "+" in name or \
            any(ch.isspace() for ch in name) or not name.isprintable():
        raise WitnessError(f"a witness name is 1..{MAX_NAME_CHARS} printable characters without spaces or '+'")
    return name


def default_name(public_key: Ed25519PublicKey) -> str:
    """``provmark.witness/<16 hex digits of SHA-256 of the public key>``."""
    return DEFAULT_NAME_PREFIX + hashlib.sha256(raw_key(public_key)).hexdigest()[:16]


def cosignature_key_id(name: str, public_key: Ed25519PublicKey) -> bytes:
    """SHA-256(name || "\\n" || 0x04 || raw key)[:4]."""
    return hashlib.sha256(name.encode() + b"\n" + COSIGNATURE_ALGORITHM + raw_key(public_key)).digest()[:KEY_ID_BYTES]


def witness_vkey(name: str, public_key: Ed25519PublicKey) -> str:
    """The witness's verifier key: ``<name>+<8 hex key id>+<base64(0x04 || raw key)>``."""
    encoded = base64.b64encode(COSIGNATURE_ALGORITHM + raw_key(public_key)).decode()
    return f"{check_name(name)}+{cosignature_key_id(name, public_key).hex()}+{encoded}"


def parse_witness_vkey(text: str) -> tuple[str, Ed25519PublicKey]:
    """(name, key) of a cosignature verifier key; WitnessError if malformed or its key id does not match."""
    if not isinstance(text, str):
        raise WitnessError("a witness verifier key is text: name+hexkeyid+base64key")
    name, _, rest = text.strip().partition("+")  # a name has no '+'; base64 may
    key_id_hex, _, encoded = rest.partition("+")
    try:
        blob = base64.b64decode(encoded, validate=True)
        key_id = bytes.fromhex(key_id_hex)
    except (ValueError, binascii.Error):
        raise WitnessError("not a witness verifier key (name+hexkeyid+base64key)") from None
    if len(blob) != 1 + 32 or blob[:1] != COSIGNATURE_ALGORITHM:
        raise WitnessError("the verifier key is not a cosignature/v1 Ed25519 key (type byte 0x04)")
    check_name(name)
    key = Ed25519PublicKey.from_public_bytes(blob[1:])
    if cosignature_key_id(name, key) != key_id:
        raise WitnessError("the witness verifier key's key id does not match its name and key")
    return name, key


# ---- cosignatures -------------------------------------------------------------------------------------

def cosigned_message(body: str, timestamp: int) -> bytes:
    """What the witness signs: the cosignature/v1 label, the time line, then the checkpoint's body."""
    return COSIGNATURE_LABEL + f"time {timestamp}\n".encode() + body.encode()


def _parsed(checkpoint: str) -> Checkpoint:
    try:
        return parse_checkpoint(checkpoint)
    except TreeHeadError as error:
        raise WitnessError(str(error)) from None


def cosign(checkpoint: str, name: str, private_key: Ed25519PrivateKey, timestamp: int | None = None) -> str:
    """The checkpoint note with this witness's cosignature line appended (an earlier one by the same witness
    name and key is replaced). ``timestamp``: POSIX seconds, default now."""
    body = _parsed(checkpoint).body
    stamp = int(time.time()) if timestamp is None else timestamp
    if not 0 <= stamp <= MAX_TIMESTAMP:
        raise WitnessError("a cosignature timestamp is POSIX seconds in [0, 2^63)")
    key_id = cosignature_key_id(check_name(name), private_key.public_key())
    blob = key_id + struct.pack(">Q", stamp) + private_key.sign(cosigned_message(body, stamp))
    kept = [line for line in checkpoint[len(body) + 1:].split("\n")[:-1] if not _is_line_of(line, name, key_id)]
    lines = [*kept, f"{SIGNATURE_DASH} {name} {base64.b64encode(blob).decode()}"]
    return body + "\n" + "".join(line + "\n" for line in lines)


def _is_line_of(line: str, name: str, key_id: bytes) -> bool:
    dash, _, rest = line.partition(" ")
    signer, _, encoded = rest.rpartition(" ")
    try:
        return dash == SIGNATURE_DASH and signer == name and base64.b64decode(encoded)[:KEY_ID_BYTES] == key_id
    except (ValueError, binascii.Error):
        return False


def verify_cosignature(checkpoint: str, name: str, public_key: Ed25519PublicKey) -> int:
    """The timestamp (POSIX seconds) of the checkpoint's valid cosignature by witness ``name`` with this key;
    WitnessError when there is none, or it does not verify."""
    parsed = _parsed(checkpoint)
    key_id = cosignature_key_id(name, public_key)
    lines = [rest for signer, hash_, rest in parsed.signatures if signer == name and hash_ == key_id]
    if not lines:
        raise WitnessError(f"the checkpoint of size {parsed.tree_size} has no cosignature by witness {name}")
    for rest in lines:
        if len(rest) == TIMESTAMP_BYTES + SIGNATURE_BYTES:
            (stamp,) = struct.unpack(">Q", rest[:TIMESTAMP_BYTES])
            if stamp > MAX_TIMESTAMP:
                continue
            try:
                public_key.verify(rest[TIMESTAMP_BYTES:], cosigned_message(parsed.body, stamp))
                return stamp
            except InvalidSignature:
                continue
    raise WitnessError(f"the cosignature by witness {name} on the checkpoint of size {parsed.tree_size} "
                       "does not verify")


def verify_cosignature_vkey(checkpoint: str, vkey: str) -> tuple[str, int]:
    """(witness name, timestamp) of a valid cosignature by the witness of verifier key ``vkey``."""
    name, key = parse_witness_vkey(vkey)
    return name, verify_cosignature(checkpoint, name, key)


def merge_cosignatures(checkpoint: str, cosigned: str) -> str:
    """``checkpoint`` with the signature lines of ``cosigned`` that it lacks, when both are the same note body
    (same origin, size and root); else ``checkpoint`` unchanged. Signatures are not checked here."""
    mine, theirs = _parsed(checkpoint), _parsed(cosigned)
    if mine.body != theirs.body:
        return checkpoint
    have = set(checkpoint[len(mine.body) + 1:].split("\n"))
    extra = [line for line in cosigned[len(theirs.body) + 1:].split("\n")[:-1] if line not in have]
    return checkpoint + "".join(line + "\n" for line in extra)


# ---- the witness's decision -------------------------------------------------------------------------

def check_update(previous: str | None, log_key: Ed25519PublicKey, new: str, proof: Sequence[bytes],
                 origin: str | None = None) -> Checkpoint:
    """The new checkpoint, if the witness may cosign it after ``previous`` (the last it cosigned, or None on
    its first run); ``Refusal`` otherwise. ``proof``: the consistency path from ``previous``'s size to the new
    size (unused when the sizes are equal or there is no previous). ``origin``: the log's name to pin on a
    first run (default: whatever the checkpoint says, if the log key signed it under that name)."""
    try:
        checkpoint = parse_checkpoint(new)
    except TreeHeadError as error:
        raise Refusal(MALFORMED, f"the log's head is not a checkpoint: {error}") from None
    before = _parsed(previous) if previous is not None else None
    expected = before.origin if before is not None else origin
    if expected is not None and checkpoint.origin != expected:
        raise Refusal(ORIGIN_CHANGED, f"the checkpoint is of log {checkpoint.origin!r}, not of the log this witness "
                                      f"follows ({expected!r})")
    try:
        verify_checkpoint(new, checkpoint.origin, log_key)
    except TreeHeadError as error:
        raise Refusal(LOG_SIGNATURE, f"the checkpoint is not signed by the pinned log key: {error}") from None
    if before is None:
        return checkpoint
    old_size, new_size = before.tree_size, checkpoint.tree_size
    if new_size < old_size:
        raise Refusal(ROLLBACK, f"the log's head shrank: size {new_size}, but this witness cosigned size "
                                f"{old_size} (a rollback, or another view of the log)")
    if new_size == old_size:
        if checkpoint.root_hash != before.root_hash:
            raise Refusal(FORK, f"the log signed two trees of size {new_size} with different roots (a fork): "
                                f"{before.root_hash.hex()} cosigned, {checkpoint.root_hash.hex()} now")
        return checkpoint
    if old_size > 0 and not verify_consistency(old_size, new_size, before.root_hash, checkpoint.root_hash, proof):
        raise Refusal(INCONSISTENT, f"the log at size {new_size} does not extend the tree of size {old_size} this "
                                    "witness cosigned: the consistency proof does not verify (history was "
                                    "rewritten)")
    return checkpoint


def witness_update(previous: str | None, log_key: Ed25519PublicKey, new: str, proof: Sequence[bytes], name: str,
                   private_key: Ed25519PrivateKey, timestamp: int | None = None, origin: str | None = None) -> str:
    """``new`` cosigned by this witness if ``check_update`` accepts it; ``Refusal`` otherwise."""
    check_update(previous, log_key, new, proof, origin)
    return cosign(new, name, private_key, timestamp)
