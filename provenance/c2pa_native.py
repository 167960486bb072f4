"""What c2pa-python does not wrap: c2pa-rs's data-hash signing, through ctypes on the wrapper's own
library and handles; and the c2pa contexts and signers this package keeps, one set per thread.

c2pa-python's ``Builder.sign`` refuses ``text/plain``, but the shared library exports the data-hash
API that embeds nothing and signs a caller-computed ``c2pa.hash.data``:

1. ``c2pa_builder_data_hashed_placeholder`` adds the hash assertion and returns the store's final size
   (c2pa-rs pads the signed store to it when given the signer's reserve size);
2. ``c2pa_builder_sign_data_hashed_embeddable`` signs with our ``DataHash`` JSON and returns the store.

Builders are single-use, made per call; signers and contexts are cached per thread, so no c2pa
object is ever used by two threads at once.
"""

from __future__ import annotations

import ctypes
import json
import threading

import c2pa
from c2pa.c2pa import _lib, _read_native_error
from cryptography.hazmat.primitives import serialization

from provenance.c2pa_credential import C2paCredential
from provenance.c2pa_x509 import TRUST_CONFIG_EKUS

STORE_FORMAT = b"application/c2pa"  # a bare manifest store: "text/plain" is NotSupported here
_BytesOut = ctypes.POINTER(ctypes.c_ubyte)

_lib.c2pa_builder_data_hashed_placeholder.argtypes = [
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.POINTER(_BytesOut)]
_lib.c2pa_builder_data_hashed_placeholder.restype = ctypes.c_int64
_lib.c2pa_builder_sign_data_hashed_embeddable.argtypes = [
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(_BytesOut)]
_lib.c2pa_builder_sign_data_hashed_embeddable.restype = ctypes.c_int64

# verify_after_sign: c2pa-rs checks each new manifest (certificate profile, structure) before returning it
SIGNING_SETTINGS = {"verify": {"verify_after_sign": True, "ocsp_fetch": False, "remote_manifest_fetch": False},
                     "trust": {"trust_config": TRUST_CONFIG_EKUS}}
_reading = threading.local()


class C2paNativeError(Exception):
    """c2pa-rs refused an operation; the message is the library's error type and text."""


def _handle(resource) -> ctypes.c_void_p:
    return ctypes.cast(resource._handle, ctypes.c_void_p)


def _take_bytes(size: int, out: _BytesOut, what: str) -> bytes:
    if size < 0 or not out:
        raise C2paNativeError(f"{what}: {_read_native_error() or 'c2pa-rs gave no reason'}")
    try:
        return ctypes.string_at(out, size)
    finally:
        _lib.c2pa_free(out)


def new_builder(credential: C2paCredential, definition: dict) -> c2pa.Builder:
    """A Builder for one manifest, on this thread's signing context of ``credential``."""
    cache = credential.per_thread
    if getattr(cache, "context", None) is None:
        cache.context = c2pa.Context.from_dict(SIGNING_SETTINGS)
    return c2pa.Builder(definition, context=cache.context)


def signer_for(credential: C2paCredential) -> c2pa.Signer:
    """This thread's c2pa signer of ``credential``. It is given the key (a PEM made in memory, never
    written anywhere) rather than a callback: c2pa-rs reserves 10 KB for a callback's signature, which
    made every manifest store 12.8 KB instead of 3.5 KB, and an embedded text 52 KB longer, not 14 KB."""
    cache = credential.per_thread
    if getattr(cache, "signer", None) is None:
        key_pem = credential.signing_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        info = c2pa.C2paSignerInfo(credential.algorithm.encode(), credential.chain_pem.encode(), key_pem,
                                   credential.tsa_url.encode() if credential.tsa_url else None)
        cache.signer = c2pa.Signer.from_info(info)
    return cache.signer


def hashed_placeholder_size(builder: c2pa.Builder, signer: c2pa.Signer) -> int:
    """Add the ``c2pa.hash.data`` assertion to ``builder`` and return the size in bytes that the
    signed manifest store will have."""
    out = _BytesOut()
    size = _lib.c2pa_builder_data_hashed_placeholder(_handle(builder), signer.reserve_size(), STORE_FORMAT,
                                                      ctypes.byref(out))
    return len(_take_bytes(size, out, "the data-hash placeholder was refused"))


def sign_data_hashed(builder: c2pa.Builder, signer: c2pa.Signer, data_hash: dict) -> bytes:
    """Sign ``builder``'s manifest with ``data_hash`` (a ``c2pa.hash.data`` as JSON: exclusions, name,
    alg, hash as a list of byte values, pad) and return the JUMBF manifest store."""
    out = _BytesOut()
    size = _lib.c2pa_builder_sign_data_hashed_embeddable(
        _handle(builder), _handle(signer), json.dumps(data_hash).encode(), STORE_FORMAT, None, ctypes.byref(out))
    return _take_bytes(size, out, "signing was refused")


def reading_context(trust_anchors_pem: str) -> c2pa.Context:
    """This thread's reading context for ``trust_anchors_pem`` ("" trusts no root): trust verified,
    our EKU list, and no network (no OCSP, no remote manifests)."""
    contexts = getattr(_reading, "contexts", None)
    if contexts is None:
        contexts = _reading.contexts = {}
    context = contexts.get(trust_anchors_pem)
    if context is None:
        trust = {"trust_config": TRUST_CONFIG_EKUS}
        if trust_anchors_pem:
            trust["trust_anchors"] = trust_anchors_pem
        settings = {"verify": {"verify_trust": True, "ocsp_fetch": False, "remote_manifest_fetch": False},
                    "trust": trust}
        if len(contexts) >= 8:  # anchors rarely vary; a caller that varies them does not grow this
            contexts.clear()
        context = contexts[trust_anchors_pem] = c2pa.Context.from_dict(settings)
    return context
