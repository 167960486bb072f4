"""Two-part keys: a private half that never leaves the keyring and a detection half that may be
published, so that anyone can verify text without asking us, while a spoof made with the published half is
still told apart from our own output.

* **Generation** biases every position towards the green list of BOTH halves (+delta for each; hard: both
  lists at once), two independent keyed lists of the same spec. Genuine text is green-rich under each.
* **The public half** is ``HMAC-SHA256(secret, PUBLIC_HALF_LABEL)``: a PRF output, so publishing it says
  nothing about the secret. With it, anyone runs the plain KGW test (``provmark detect --public-key FILE``),
  and anyone can also write text that passes it: the public verdict alone is spoofable by design.
* **The private half** decides our verdict. A spoofer steered by the public half makes text green under
  the public list only; its private colours are coins. Both halves' colours of a genuine text are
  exchangeable (two i.i.d. keys, one symmetric bias), so among the counted positions where the halves
  disagree, "public green, private red" (b) and "private green, public red" (c) are equally likely:
  b ~ Binomial(b + c, 1/2) given b + c (McNemar's exact test). A spoof makes b >> c. ``spoof_test`` is that
  test, and a verdict whose public half is positive and private half negative is ``spoof_suspected`` when it
  rejects at ``SPOOF_ALPHA``.

The published document (``PublicKey``) names the key, its spec, the tokenizer it is defined over and the
detection half; it never holds the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import asdict, dataclass

import numpy as np
from scipy import special

from watermark.config import SpecError, WatermarkSpec
from watermark.key_info import KEY_ID_RE, KeySpecError, key_fingerprint

PUBLIC_HALF_LABEL = b"provmark/public-detection-half/v1"
FORMAT = "provmark-public-key/v1"
SPOOF_ALPHA = 1e-3  # a verdict is spoof_suspected when the paired test rejects at this level
MAX_DOCUMENT_BYTES = 65536  # the document is 1-3 KB (most of it the calibration); refuse anything far larger unread
_HEX64 = re.compile("[0-9a-f]{64}")
_HEX16 = re.compile("[0-9a-f]{16}")


class PublicKeyError(ValueError):
    """A public-key document that is not one: the message names the field."""


def public_half_secret(secret: bytes) -> bytes:
    """The detection half of a two-part key whose private half is ``secret`` (32 bytes, one-way)."""
    return hmac.new(secret, PUBLIC_HALF_LABEL, hashlib.sha256).digest()


def public_half_id(key_id: str) -> str:
    """The name the published half goes by beside its key: its calibration's, and its entry among the secrets a
    batch ships to workers (a dot never occurs in a key id, so it names no key)."""
    return f"{key_id}.public"


def require_two_part_spec(spec: str) -> None:
    """KeySpecError unless ``spec`` (canonical) is a kgw spec: the two halves add their biases, which only
    the red/green family does (a sampling watermark draws one token from one keyed race)."""
    if not spec.startswith("kgw:"):
        raise KeySpecError(f"a two-part key needs a kgw spec (its two green lists add their biases), got {spec}")


def spoof_test(public_green, private_green, counted=None) -> dict:
    """McNemar's exact test over positions counted under both halves (bool arrays, one entry each; with
    ``counted``, a bool mask of the positions to take, the arrays are the whole text's): b = public green and
    private red, c = private green and public red; p = P(Binomial(b + c, 1/2) >= b)."""
    public_only, private_only = public_green & ~private_green, private_green & ~public_green
    if counted is not None:
        public_only &= counted
        private_only &= counted
    b, c = int(np.count_nonzero(public_only)), int(np.count_nonzero(private_only))
    # the binomial's upper tail as scipy.stats.binom.sf computes it, without its ~0.15 ms of argument handling
    p = float(special.bdtrc(b - 1, b + c, 0.5)) if b + c else 1.0
    return {"public_only": b, "private_only": c, "p_value": p}


@dataclass(frozen=True, slots=True)
class PublicKey:
    """The publishable side of a two-part key: everything a verifier needs, nothing more."""

    key_id: str
    spec: str  # canonical kgw spec (colours: scheme, h, gamma, prf)
    vocab_size: int  # V of the model's logits, part of the spec fingerprint
    tokenizer_fingerprint: str  # the tokenizer the colours are defined over (watermark.vocab)
    model_id: str
    detection_half: str  # 64 hex digits: the public half's PRF key
    fingerprint: str  # key_fingerprint of the detection half, to tell published keys apart
    calibration: dict | None = None  # the published half's measured null (detector.calibration.Calibration)
    format: str = FORMAT

    @property
    def secret(self) -> bytes:
        """The detection half as the PRF key a ``Watermark`` takes."""
        return bytes.fromhex(self.detection_half)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def make(cls, key_id: str, spec: str, detection_half: bytes, vocab, calibration: dict | None = None) -> PublicKey:
        return cls(key_id, spec, vocab.vocab_size, vocab.fingerprint, vocab.model_id, detection_half.hex(),
                   key_fingerprint(detection_half), calibration)

    @classmethod
    def from_json(cls, text: str | bytes) -> PublicKey:
        """Parse and check a document (PublicKeyError naming what is wrong; never echoes the half)."""
        if len(text) > MAX_DOCUMENT_BYTES:
            raise PublicKeyError(f"public key: longer than {MAX_DOCUMENT_BYTES} bytes")
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise PublicKeyError(f"public key: not JSON ({exc})") from None
        names = {"key_id", "spec", "vocab_size", "tokenizer_fingerprint", "model_id", "detection_half",
                 "fingerprint", "calibration", "format"}
        if not isinstance(raw, dict) or set(raw) != names:
            missing = sorted(names - set(raw)) if isinstance(raw, dict) else sorted(names)
            raise PublicKeyError(f"public key: expected the fields {', '.join(sorted(names))}"
                                 + (f" (missing: {', '.join(missing)})" if missing else ""))
        if raw["format"] != FORMAT:
            raise PublicKeyError(f"format: expected {FORMAT!r}")
        for name in ("key_id", "spec", "tokenizer_fingerprint", "model_id", "detection_half", "fingerprint"):
            if not isinstance(raw[name], str):
                raise PublicKeyError(f"{name}: expected a string")
        if not (raw["calibration"] is None or isinstance(raw["calibration"], dict)):
            raise PublicKeyError("calibration: expected an object or null")
        if not KEY_ID_RE.fullmatch(raw["key_id"]):
            raise PublicKeyError("key_id: not a provmark key id")
        if isinstance(raw["vocab_size"], bool) or not isinstance(raw["vocab_size"], int) or raw["vocab_size"] <= 1:
            raise PublicKeyError("vocab_size: expected an integer > 1")
        if not _HEX64.fullmatch(raw["detection_half"]):
            raise PublicKeyError("detection_half: expected 64 lowercase hex digits")
        if not _HEX16.fullmatch(raw["fingerprint"]) or raw["fingerprint"] != key_fingerprint(
                bytes.fromhex(raw["detection_half"])):
            raise PublicKeyError("fingerprint: does not match the detection half (a damaged or edited document)")
        try:
            spec = WatermarkSpec.parse(raw["spec"])
        except SpecError as exc:
            raise PublicKeyError(f"spec: {exc}") from None
        if not spec.needs_key:  # WatermarkSpec: kgw (keyed) or hf (public): a two-part key is keyed
            raise PublicKeyError("spec: a public key is a kgw spec")
        return cls(**{**raw, "spec": spec.format()})
