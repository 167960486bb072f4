"""Pydantic models the generation routes share: sampler fields with their limits, chat messages,
usage, watermark and receipt bodies. They validate requests and produce the OpenAPI document.

The limits are SamplingParams' own ranges (generation/sample/params.py) plus upper bounds that keep
one request's cost and numerics sane; SamplingParams still checks every value (and cross-field rules
such as min_new_tokens <= max_new_tokens) after these.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from api.generation.routes_common import MAX_LOGPROBS, invalid_field
from watermark.config import MAX_SPEC_CHARS
from watermark.key_info import KEY_ID_RULE

MAX_NEW_TOKENS = 2048  # the engine's default max_model_len: no request can generate more
MAX_TEMPERATURE = 100.0  # far past where sampling is uniform; bounds the logits/temperature division
MAX_TOP_K = 1 << 20  # above any vocabulary in use; top_k >= V means "keep everything"
MAX_PENALTY = 100.0  # repetition penalty: 1 is off, values above ~2 already wreck text
MAX_MIROSTAT_TAU = 100.0  # target surprise in bits; log2(V) is ~16 for V = 49,152
MAX_NGRAM = 64
MAX_STOP = 16  # stop strings per request
MAX_STOP_CHARS = 256
MAX_LIST = 1024  # bad words / stop token ids / logit bias entries
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's documented logit_bias range [-100, 100]
SEED_LIMIT = 2**64 - 1  # SamplingParams.seed lies in [0, 2**64)

TOKEN_ID_MARK = "x-token-id"  # the served document sets maximum = V - 1 on schemas marked so
TOKEN_KEY_RULE = r"^[0-9]{1,9}$"  # logit_bias keys: token ids written as JSON object keys

Role = Literal["system", "developer", "user", "assistant"]
TokenId = Annotated[int, Field(ge=0, json_schema_extra={TOKEN_ID_MARK: True})]
TokenIds = Annotated[list[TokenId], Field(min_length=1, max_length=MAX_LIST)]
NonEmptyText = Annotated[str, StringConstraints(min_length=1)]
StopString = Annotated[str, StringConstraints(min_length=1, max_length=MAX_STOP_CHARS)]
Stops = StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)]
KeyId = Annotated[str, StringConstraints(pattern=f"^{KEY_ID_RULE}$")]
Bias = Annotated[float, Field(ge=-LOGIT_BIAS_LIMIT, le=LOGIT_BIAS_LIMIT)]
LogitBias = Annotated[dict[Annotated[str, StringConstraints(pattern=TOKEN_KEY_RULE)], Bias],
                      Field(max_length=MAX_LIST, json_schema_extra={"propertyNames": {"pattern": TOKEN_KEY_RULE}})]


class TextPart(BaseModel):
    """A text part of a multi-part message content (OpenAI's content-part form)."""

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Role
    content: str | list[TextPart] | None = None
    name: str | None = Field(None, max_length=64, description="the participant's name (OpenAI: up to 64 characters)")

    def as_template_message(self) -> dict:
        """``{"role", "content"}`` for the chat template (developer -> system, parts joined)."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content or ""}


class SamplerFields(BaseModel):
    """The sampler options both APIs share, under SamplingParams' names."""

    top_k: int = Field(0, ge=0, le=MAX_TOP_K, description="keep the k most likely tokens (0 = off)")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="drop tokens below min_p x the top probability")
    typical_p: float = Field(1.0, gt=0.0, le=1.0, description="locally typical sampling mass (1 = off)")
    epsilon_cutoff: float = Field(0.0, ge=0.0, lt=1.0, description="truncation sampling: drop p < epsilon")
    eta_cutoff: float = Field(0.0, ge=0.0, lt=1.0, description="eta sampling (entropy-dependent cut-off)")
    mirostat_mode: Literal[0, 1, 2] = Field(0, description="mirostat version: 0 off, 1, 2")
    mirostat_tau: float = Field(5.0, gt=0.0, le=MAX_MIROSTAT_TAU, description="mirostat target surprise (bits)")
    mirostat_eta: float = Field(0.1, gt=0.0, le=1.0, description="mirostat learning rate")
    repetition_penalty: float = Field(1.0, gt=0.0, le=MAX_PENALTY, description="CTRL-style penalty (1 = off)")
    no_repeat_ngram_size: int = Field(0, ge=0, le=MAX_NGRAM, description="ban repeating n-grams of this size")
    bad_words_ids: list[TokenIds] | None = Field(None, max_length=MAX_LIST,
                                                 description="token-id sequences never to generate")
    stop_token_ids: list[TokenId] | None = Field(None, max_length=MAX_LIST, description="stop at any of these ids")
    ignore_eos: bool = Field(False, description="keep going past end-of-text")
    watermark: Annotated[str, StringConstraints(min_length=1, max_length=MAX_SPEC_CHARS)] | bool | None = Field(
        None, description='a watermark spec string (grammar and bounds: the specs reference; 422 otherwise), or "off" '
                          "for none; absent = the key's own spec. Deprecated for one release: false or null (none), "
                          "true (the key's own spec)")
    keys: list[KeyId] | None = Field(None, min_length=1, max_length=1,
                                     description="the key that marks the text, as a list of one key id (the field "
                                                 "detection takes several in; default: the active key); needs a keyed "
                                                 "watermark: with the watermark off or an hf: spec, 422")
    key_id: KeyId | None = Field(None, description="deprecated for one release: keys=[key_id]")
    c2pa: Literal["detached", "inline", "embedded", "off"] = Field(
        "detached", description="the text's C2PA manifest: detached (stored; its id and URL answered), inline "
                                "(also its bytes, base64), embedded (carried inside the text, C2PA 2.4 Annex A.8), "
                                "or off")


def logit_bias_values(bias: dict[str, float] | None, field: str = "logit_bias") -> dict[int, float] | None:
    """OpenAI sends token ids as JSON object keys (strings); SamplingParams wants ints."""
    if bias is None:
        return None
    try:
        return {int(token): float(value) for token, value in bias.items()}
    except ValueError:
        raise invalid_field(field, "keys must be integer token ids") from None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class WatermarkInfo(BaseModel):
    """The watermark a generation carries (never the secret)."""

    spec: str
    key_id: str | None
    spec_fingerprint: str = Field(description="the spec's fingerprint, as the receipt names it")
    fingerprint: str = Field(description="deprecated for one release: spec_fingerprint")


class Receipt(BaseModel):
    """A signed generation receipt. ``jws`` is the receipt itself: a compact JWS (alg Ed25519) whose claims
    are these fields plus ``iss``, ``iat``, ``jti`` and the C2PA manifest id; verify it with any JOSE library
    against GET /.well-known/jwks.json (``provmark receipts verify``). ``signature`` is the legacy form
    (Ed25519 over the canonical JSON of the fields, key at GET /v1/receipts/public-key), kept for one
    release."""

    model_config = ConfigDict(extra="allow")

    text_sha256: str
    token_count: int
    model_id: str
    spec_fingerprint: str
    key_id: str
    created_at: str
    receipt_id: str
    signature: str
    signer_id: str
    algorithm: str
    jws: str


class C2paInfo(BaseModel):
    """Where a generated text's C2PA manifest is: ``manifest_url`` serves the manifest store
    (application/c2pa); ``manifest_store`` is its bytes (base64) when the request asked ``c2pa: inline``;
    ``embedded``: the text carries it (C2PA 2.4 Annex A.8)."""

    manifest_id: str
    manifest_url: str
    embedded: bool
    manifest_store: str | None = None


class Provenance(BaseModel):
    """The receipt, watermark and C2PA manifest of a generation (the ``provmark`` field of OpenAI-style
    answers)."""

    receipt: Receipt
    watermark: WatermarkInfo | None
    c2pa: C2paInfo | None = None


__all__ = [
    "MAX_LIST",
    "MAX_LOGPROBS",
    "MAX_NEW_TOKENS",
    "MAX_STOP",
    "MAX_TEMPERATURE",
    "SEED_LIMIT",
    "TOKEN_ID_MARK",
    "ChatMessage",
    "LogitBias",
    "NonEmptyText",
    "Provenance",
    "Receipt",
    "SamplerFields",
    "Stops",
    "TextPart",
    "TokenIds",
    "Usage",
    "WatermarkInfo",
    "logit_bias_values",
]
