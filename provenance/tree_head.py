"""Signed tree heads of the transparency log, in two encodings signed by the one Ed25519 log key.

1. RFC 9162 §4.9/§4.10: the signature is Ed25519 over the TLS encoding of TreeHeadDataV2, 51 bytes:

       uint64 timestamp        8 bytes big-endian, milliseconds since the epoch
       uint64 tree_size        8 bytes big-endian
       opaque root_hash<32..2^8-1>    1 length byte (0x20), then the 32-byte root
       Extension sth_extensions<0..2^16-1>    2 length bytes 0x00 0x00 (no extensions)

2. A C2SP tlog-checkpoint signed note, the text::

       <origin>\\n<tree size in decimal>\\n<base64 root>\\n\\n— <origin> <base64(key hash || signature)>\\n

   signed (Ed25519) over its body: the first three lines with their newlines (the blank line and the
   signature line are not signed). The key hash is ``provenance.log_key.note_key_hash(origin, key)``.

The two never sign the same bytes: a TLS head ends in two zero bytes, a note body in "\\n". A head's
JSON form (``TreeHead.to_dict``)::

    {"tree_size", "timestamp", "root_hash" (base64), "root_hash_hex", "signature" (base64, over 1.),
     "key_id" (the key's RFC 7638 thumbprint), "log_id", "checkpoint" (2., the whole note)}
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from provenance.log_key import jwk_thumbprint, log_id, note_key_hash
from provenance.merkle import HASH_SIZE

SIGNATURE_DASH = "\u2014"  # the em dash that starts a signed note's signature line
MAX_UINT64 = 2**64 - 1
_SIZE_RE = re.compile(r"0|[1-9][0-9]{0,19}")


class TreeHeadError(ValueError):
    """A tree head that is malformed or whose signatures do not verify; the message says which."""


@dataclass(slots=True, frozen=True)
class TreeHead:
    """One signed tree head (module docstring)."""

    tree_size: int
    timestamp: int  # milliseconds since the epoch
    root_hash: bytes
    signature: bytes  # Ed25519 over tree_head_data(timestamp, tree_size, root_hash)
    key_id: str
    log_id: str
    checkpoint: str

    def to_dict(self) -> dict:
        return {"tree_size": self.tree_size, "timestamp": self.timestamp,
                "root_hash": base64.b64encode(self.root_hash).decode(), "root_hash_hex": self.root_hash.hex(),
                "signature": base64.b64encode(self.signature).decode(), "key_id": self.key_id,
                "log_id": self.log_id, "checkpoint": self.checkpoint}

    @classmethod
    def from_dict(cls, data) -> TreeHead:
        """A head from its JSON form; TreeHeadError naming the first bad field."""
        if not isinstance(data, dict):
            raise TreeHeadError("a tree head must be a JSON object")
        for name in ("tree_size", "timestamp"):
            value = data.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_UINT64:
                raise TreeHeadError(f"tree head {name} must be an integer in [0, 2^64)")
        for name in ("root_hash", "signature", "key_id", "log_id", "checkpoint"):
            if not isinstance(data.get(name), str):
                raise TreeHeadError(f"tree head {name} must be a string")
        root, signature = _b64(data["root_hash"], "root_hash"), _b64(data["signature"], "signature")
        if len(root) != HASH_SIZE:
            raise TreeHeadError(f"tree head root_hash must be {HASH_SIZE} bytes")
        if "root_hash_hex" in data and data["root_hash_hex"] != root.hex():
            raise TreeHeadError("tree head root_hash_hex is not root_hash")
        return cls(data["tree_size"], data["timestamp"], root, signature, data["key_id"], data["log_id"],
                   data["checkpoint"])


def tree_head_data(timestamp: int, tree_size: int, root_hash: bytes) -> bytes:
    """The TLS encoding of TreeHeadDataV2 (module docstring): exactly the bytes the head signature covers."""
    if len(root_hash) != HASH_SIZE:
        raise TreeHeadError(f"root_hash must be {HASH_SIZE} bytes")
    return struct.pack(">QQB", timestamp, tree_size, len(root_hash)) + root_hash + struct.pack(">H", 0)


def checkpoint_body(origin: str, tree_size: int, root_hash: bytes) -> str:
    """The signed body of a checkpoint note: origin, size and base64 root, one per line."""
    if not origin or "\n" in origin or origin != origin.strip():
        raise TreeHeadError("a checkpoint origin is one non-empty line without outer spaces")
    return f"{origin}\n{tree_size}\n{base64.b64encode(root_hash).decode()}\n"


def sign_tree_head(private_key: Ed25519PrivateKey, origin: str, tree_size: int, root_hash: bytes,
                   timestamp: int) -> TreeHead:
    """Both signatures over (timestamp, tree_size, root_hash); the note is named ``origin``."""
    public_key = private_key.public_key()
    signature = private_key.sign(tree_head_data(timestamp, tree_size, root_hash))
    body = checkpoint_body(origin, tree_size, root_hash)
    note_signature = note_key_hash(origin, public_key) + private_key.sign(body.encode())
    checkpoint = f"{body}\n{SIGNATURE_DASH} {origin} {base64.b64encode(note_signature).decode()}\n"
    return TreeHead(tree_size, timestamp, root_hash, signature, jwk_thumbprint(public_key), log_id(public_key),
                    checkpoint)


@dataclass(slots=True, frozen=True)
class Checkpoint:
    origin: str
    tree_size: int
    root_hash: bytes
    body: str  # the signed text
    signatures: tuple[tuple[str, bytes, bytes], ...]  # (name, key hash, signature)


def parse_checkpoint(text: str) -> Checkpoint:
    """The parts of a checkpoint note; TreeHeadError if it is not one."""
    body, separator, signature_block = text.rpartition("\n\n")
    if not separator or not text.endswith("\n"):
        raise TreeHeadError("the checkpoint is not a signed note (body, blank line, signature lines)")
    body += "\n"
    lines = body.split("\n")[:-1]
    if len(lines) < 3 or not lines[0] or not _SIZE_RE.fullmatch(lines[1]):
        raise TreeHeadError("the checkpoint body must be origin, decimal tree size and base64 root hash lines")
    root = _b64(lines[2], "checkpoint root hash")
    signatures = []
    for line in signature_block.split("\n")[:-1]:
        dash, _, rest = line.partition(" ")
        name, _, encoded = rest.rpartition(" ")
        blob = _b64(encoded, "checkpoint signature") if dash == SIGNATURE_DASH and name else b""
        if len(blob) < 5:
            raise TreeHeadError("a checkpoint signature line must be '— <name> <base64(key hash || signature)>'")
        signatures.append((name, blob[:4], blob[4:]))
    return Checkpoint(lines[0], int(lines[1]), root, body, tuple(signatures))


def verify_checkpoint(text: str, name: str, public_key: Ed25519PublicKey) -> Checkpoint:
    """The checkpoint, if a signature line by ``name`` with this key's hash verifies over its body."""
    checkpoint = parse_checkpoint(text)
    key_hash = note_key_hash(name, public_key)
    for signer, signer_hash, signature in checkpoint.signatures:
        if signer == name and signer_hash == key_hash:
            try:
                public_key.verify(signature, checkpoint.body.encode())
                return checkpoint
            except InvalidSignature:
                raise TreeHeadError(f"the checkpoint signature by {name} does not verify") from None
    raise TreeHeadError(f"the checkpoint has no signature by {name} with this key")


def verify_tree_head(head: TreeHead, public_key: Ed25519PublicKey) -> None:
    """Raise TreeHeadError unless ``head`` was signed by ``public_key`` in both encodings and its
    checkpoint states the same size and root."""
    if head.key_id != jwk_thumbprint(public_key):
        raise TreeHeadError(f"the head is signed by key {head.key_id}, not by the key given "
                            f"({jwk_thumbprint(public_key)})")
    if head.log_id != log_id(public_key):
        raise TreeHeadError("the head's log_id is not the given key's")
    try:
        public_key.verify(head.signature, tree_head_data(head.timestamp, head.tree_size, head.root_hash))
    except InvalidSignature:
        raise TreeHeadError(f"the signature of the tree head of size {head.tree_size} does not verify") from None
    origin = parse_checkpoint(head.checkpoint).origin
    checkpoint = verify_checkpoint(head.checkpoint, origin, public_key)
    if (checkpoint.tree_size, checkpoint.root_hash) != (head.tree_size, head.root_hash):
        raise TreeHeadError("the checkpoint states another tree size or root than the head")


def _b64(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        raise TreeHeadError(f"{what} is not base64") from None
