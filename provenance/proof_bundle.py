"""Proof bundles: what ``provmark audit prove`` and ``/v1/log/proof/*`` hand out, and their offline check.

Inclusion::

    {"type": "inclusion", "entry": base64 of the exact leaf entry bytes, "entry_json": the entry parsed,
     "leaf_index": i, "tree_size": n, "inclusion_path": [base64 node hashes, leaf upwards],
     "tree_head": a signed head of size n (provenance.tree_head.TreeHead.to_dict)}

Consistency::

    {"type": "consistency", "first_size": m, "second_size": n, "consistency_path": [base64 node hashes],
     "first_head": a signed head of size m, "second_head": a signed head of size n}

``check_bundle`` needs only the log's public key: both head signatures (TLS and checkpoint), then the
RFC 9162 verification of the path against the signed roots; the leaf hash is recomputed from the entry.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from provenance.merkle import leaf_hash, verify_consistency, verify_inclusion
from provenance.tree_head import TreeHead, TreeHeadError, verify_tree_head

INCLUSION, CONSISTENCY = "inclusion", "consistency"
MAX_PATH_NODES = 64  # a tree of up to 2^64 leaves needs at most 64 nodes per proof


class ProofError(ValueError):
    """A bundle that does not prove what it claims; the message is the reason."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def inclusion_bundle(entry: bytes, leaf_index: int, path: list[bytes], head: TreeHead) -> dict:
    """The inclusion bundle of leaf ``leaf_index`` (entry bytes ``entry``) in the tree of ``head``."""
    return {"type": INCLUSION, "entry": _b64(entry), "entry_json": json.loads(entry), "leaf_index": leaf_index,
            "tree_size": head.tree_size, "inclusion_path": [_b64(node) for node in path],
            "tree_head": head.to_dict()}


def consistency_bundle(first: TreeHead, second: TreeHead, path: list[bytes]) -> dict:
    """The consistency bundle showing ``second``'s tree extends ``first``'s."""
    return {"type": CONSISTENCY, "first_size": first.tree_size, "second_size": second.tree_size,
            "consistency_path": [_b64(node) for node in path], "first_head": first.to_dict(),
            "second_head": second.to_dict()}


def bundle_key_id(bundle) -> str | None:
    """The key id its (first) head names: which key of a JWKS to check it with."""
    if not isinstance(bundle, dict):
        return None
    head = bundle.get("tree_head") or bundle.get("first_head")
    return head.get("key_id") if isinstance(head, dict) else None


def check_bundle(bundle, public_key: Ed25519PublicKey) -> str:
    """A one-line account of what ``bundle`` proves; ProofError with the reason when it proves nothing."""
    if not isinstance(bundle, dict) or bundle.get("type") not in (INCLUSION, CONSISTENCY):
        raise ProofError(f"not a proof bundle: type must be {INCLUSION!r} or {CONSISTENCY!r}")
    try:
        if bundle["type"] == INCLUSION:
            return _check_inclusion(bundle, public_key)
        return _check_consistency(bundle, public_key)
    except TreeHeadError as error:
        raise ProofError(str(error)) from None
    except KeyError as error:
        raise ProofError(f"the bundle has no {error.args[0]!r}") from None


def _signed_head(data, public_key: Ed25519PublicKey) -> TreeHead:
    head = TreeHead.from_dict(data)
    verify_tree_head(head, public_key)
    return head


def _nodes(value, name: str) -> list[bytes]:
    if not isinstance(value, list) or len(value) > MAX_PATH_NODES:
        raise ProofError(f"{name} must be a list of at most {MAX_PATH_NODES} base64 hashes")
    try:
        return [base64.b64decode(node, validate=True) for node in value]
    except (TypeError, ValueError, binascii.Error):
        raise ProofError(f"{name} holds something that is not base64") from None


def _index(value, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProofError(f"{name} must be a non-negative integer")
    return value


def _check_inclusion(bundle: dict, public_key: Ed25519PublicKey) -> str:
    head = _signed_head(bundle["tree_head"], public_key)
    index, size = _index(bundle["leaf_index"], "leaf_index"), _index(bundle["tree_size"], "tree_size")
    if size != head.tree_size:
        raise ProofError(f"the bundle's tree_size {size} is not its head's {head.tree_size}")
    try:
        entry = base64.b64decode(bundle["entry"], validate=True)
        parsed = json.loads(entry)
    except (TypeError, ValueError, binascii.Error):
        raise ProofError("entry must be base64 of a JSON document") from None
    if "entry_json" in bundle and bundle["entry_json"] != parsed:
        raise ProofError("entry_json is not what the entry bytes say")
    if isinstance(parsed, dict) and "seq" in parsed and parsed["seq"] != index + 1:
        raise ProofError(f"the entry is event {parsed['seq']}, but leaf {index} holds event {index + 1}")
    path = _nodes(bundle["inclusion_path"], "inclusion_path")
    if not verify_inclusion(leaf_hash(entry), index, size, path, head.root_hash):
        raise ProofError(f"the inclusion path does not lead from the entry at leaf {index} to the signed root "
                         f"of the tree of size {size}")
    what = f"event {parsed.get('seq')} ({parsed.get('kind')}, subject {parsed.get('subject_id')})" \
        if isinstance(parsed, dict) else "the entry"
    return f"{what} is leaf {index} of the log at size {size}, head signed {_when(head)} by key {head.key_id}"


def _check_consistency(bundle: dict, public_key: Ed25519PublicKey) -> str:
    first, second = _signed_head(bundle["first_head"], public_key), _signed_head(bundle["second_head"], public_key)
    for name, head in (("first_size", first), ("second_size", second)):
        if name in bundle and bundle[name] != head.tree_size:
            raise ProofError(f"the bundle's {name} is not its head's tree size {head.tree_size}")
    path = _nodes(bundle["consistency_path"], "consistency_path")
    if not 0 < first.tree_size <= second.tree_size:
        raise ProofError(f"a consistency proof needs 0 < first size <= second size, not {first.tree_size} and "
                         f"{second.tree_size}")
    if not verify_consistency(first.tree_size, second.tree_size, first.root_hash, second.root_hash, path):
        raise ProofError(f"the tree of size {second.tree_size} does not extend the tree of size {first.tree_size}: "
                         "the consistency path does not verify")
    return (f"the log at size {second.tree_size} ({_when(second)}) extends the log at size {first.tree_size} "
            f"({_when(first)}), both heads signed by key {first.key_id}")


def _when(head: TreeHead) -> str:
    try:
        return datetime.fromtimestamp(head.timestamp / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    except (OverflowError, ValueError, OSError):  # a signed but absurd timestamp is still reported as signed
        return f"at {head.timestamp} ms since the epoch"
