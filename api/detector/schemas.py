"""Request and response models of the detector service: they validate requests and, through
``api.http.OpenAPI``, are the schemas of ``/openapi.json``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator

from api.http import StrictModel
from db.verdicts import MAX_PAGE_SIZE, VERDICTS, VerdictFilter
from detector.paraphrase_match import FIELD_DESCRIPTION as PARAPHRASE_FIELD
from watermark.config import MAX_SPEC_CHARS
from watermark.stats import Z_THRESHOLD
from watermark.sampling_specs import MAX_HF_SPEC_CHARS
from watermark.key_info import KEY_ID_RULE

MAX_FORCED_POSITIONS = 100_000  # more than any text under the character limit tokenizes to
MAX_TOKEN_INDEX = 2**31 - 1  # a token position; larger ones cannot index any text this service accepts
MAX_KEYS_PER_REQUEST = 32  # Holm over more keys than this is an operator mistake, not a detection
MAX_Z_THRESHOLD = 37.0  # the normal tail above ~38 underflows a double: no alpha left to test against
MIN_FPR = 1e-300  # below this the matching z threshold is no longer a finite double
MAX_SEQ = 2**62  # audit sequence numbers fit a signed 64-bit column with room to spare
MAX_MANIFEST_B64 = 1_000_000  # a text's manifest store is a few KB; a megabyte of base64 is far beyond one
BASE64_RULE = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"  # standard base64, padded

KeyId = Annotated[StrictStr, Field(pattern=f"^{KEY_ID_RULE}$")]
VerdictName = Literal["watermarked", "not_watermarked", "insufficient_text"]
assert set(VerdictName.__args__) == set(VERDICTS)


class DetectRequest(StrictModel):
    """POST /v1/detect: the text and how to score it."""

    # keys together with all_keys=true is refused (422): the document says so, so that a client built from it
    # (and the schema fuzzer) never sends the pair
    model_config = ConfigDict(extra="forbid", json_schema_extra={"not": {
        "required": ["keys", "all_keys"], "properties": {"keys": {"type": "array"}, "all_keys": {"const": True}}}})

    text: StrictStr = Field(description="the text to score, as pasted (length limit: 413 above it)")
    keys: list[KeyId] | None = Field(None, min_length=1, max_length=MAX_KEYS_PER_REQUEST,
                                     description="key ids to test (default: every detection key)")
    all_keys: StrictBool = Field(False, description="deprecated for one release: leave keys out to test every "
                                                    "detection key")
    watermark: StrictStr | None = Field(None, min_length=1, max_length=max(MAX_SPEC_CHARS, MAX_HF_SPEC_CHARS),
                                        description="watermark spec string (default: the named keys' own spec, else the default kgw spec); "
                                                    "kgw:, hf:, gumbel:, synthid:, hf:synthid,... or vllm:gumbel,...")
    windows: StrictBool = Field(False, description="also search for a watermarked passage (WinMax)")
    explain: StrictBool = Field(False, description="per-token green/red flags; needs the explain scope")
    normalize: StrictBool = Field(True, description="undo homoglyphs, invisible characters, odd spaces first")
    dedup: StrictBool = Field(True, description="count each distinct (h+1)-gram once")
    z_threshold: float = Field(Z_THRESHOLD, gt=0.0, le=MAX_Z_THRESHOLD, allow_inf_nan=False, strict=True,
                               description="verdict threshold (ignored when fpr is given)")
    fpr: float | None = Field(None, ge=MIN_FPR, lt=1.0, allow_inf_nan=False, strict=True,
                              description="target false-positive rate; wins over z_threshold")
    manifest: StrictStr | None = Field(None, min_length=4, max_length=MAX_MANIFEST_B64, pattern=BASE64_RULE,
                                       description="the text's detached C2PA manifest store (a .c2pa file), base64; "
                                                   "a manifest embedded in the text (C2PA 2.4 Annex A.8) is read "
                                                   "without it")
    forced_positions: list[Annotated[int, Field(ge=0, le=MAX_TOKEN_INDEX, strict=True)]] | None = Field(
        None, max_length=MAX_FORCED_POSITIONS,
        description="token indices where a constrained generator had fewer than two allowed tokens "
                    "(its forced_positions): left out of scoring")

    @field_validator("text")
    @classmethod
    def _valid_unicode(cls, value: str) -> str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(f"contains a lone surrogate code point at index {error.start}") from None
        return value


class Provenance(BaseModel):
    """The signed generation receipt of this exact text (``match``: how the text was matched)."""

    match: Literal["exact", "normalized"]
    receipt_id: str
    text_sha256: str
    token_count: int
    model_id: str
    spec_fingerprint: str
    key_id: str
    created_at: str
    signature: str
    signer_id: str
    algorithm: str
    jws: str | None = Field(default=None, description="the receipt as a compact JWS (receipts since the JWS form)")


class SoftBinding(BaseModel):
    alg: str
    key_id: str | None
    spec_fingerprint: str | None


class CredentialProvenance(BaseModel):
    receipt_id: str | None
    issuer: str | None
    detector_url: str | None


class Credentials(BaseModel):
    """What a text's C2PA manifest says and whether it holds (``provenance.c2pa_reading``).

    ``trusted``: valid and signed under a trust anchor of this service; ``hash_matches``: the text is
    exactly the one signed; ``soft_binding_agrees``: the manifest's watermark (key and spec) is the one
    this verdict found (None when the manifest names none)."""

    model_config = ConfigDict(extra="allow")

    source: Literal["embedded", "detached"]
    manifest_id: str | None
    validation_state: str
    valid: bool
    trusted: bool
    hash_matches: bool | None
    signature_valid: bool | None
    failures: list[str]
    model_id: str | None = None
    digital_source_type: str | None = None
    soft_binding: SoftBinding | None = None
    provenance: CredentialProvenance | None = None
    problem: str | None = None
    soft_binding_agrees: bool | None = None


class DetectResponse(BaseModel):
    """The verdict, the id it is stored under and the matching generation receipt, if any.

    A token with the ``explain`` (or ``admin``) scope gets every field; a ``detect`` token gets the verdict,
    a coarse, dithered z / p-value (none for insufficient_text) and ``disclosure`` naming that rule, and no
    counts: the fields marked "explain scope" are absent (see docs/security.md, detector/disclosure.py)."""

    model_config = ConfigDict(extra="allow")  # further Verdict fields pass through

    id: str
    verdict: VerdictName
    z_score: float | None
    p_value: float | None = Field(description="exact for explain; for detect an upper bound on it, coarse and dithered")
    key_id: str | None
    watermark: str
    spec_fingerprint: str = Field(description="the scored spec's fingerprint (the spec and the vocabulary size)")
    fingerprint: str = Field(description="deprecated for one release: spec_fingerprint")
    text_sha256: str
    common_units: str | None = Field(description="the common-unit table that named them (None for hf specs)")
    windows: dict[str, Any] | None
    provenance: Provenance | None
    credentials: Credentials | None = Field(
        None, description="the text's C2PA Content Credentials, when it carries a manifest or one was given: the "
                          "second layer beside the watermark verdict")
    disclosure: str | None = Field(None, description="detect scope: the rule that coarsened the scores")
    num_tokens_scored: int | None = Field(None, description="explain scope")
    num_green_tokens: int | None = Field(None, description="explain scope (None for sampling specs)")
    statistic: dict[str, Any] | None = Field(
        None, description="explain scope, sampling specs: the Gumbel sum, or SynthID ones, mean and weighted-mean g")
    green_fraction: float | None = Field(None, description="explain scope")
    num_forced_positions: int | None = Field(None, description="explain scope")
    num_common_positions: int | None = Field(
        None, description="explain scope: scored positions left out: their unit is common in human text")
    calibration: dict[str, Any] | None = Field(
        None, description="explain scope: the best key's calibration: id, length bucket, its measured null, where it "
                          "was measured (measured_on: shipped corpora, or yours via `keys calibrate --corpus`), "
                          "and whether that null set the p-value (guarded); None when the key has no calibration")
    promise: dict[str, Any] | None = Field(
        None, description="keyed kgw: verdicts: what the p-value promises (detector/promise.py): measured on your texts "
                          "of this kind (`keys calibrate --corpus`) or bounded for a collection nobody measured, the "
                          "text's kind (prose or code), the margin in z, z_needed and tokens_factor (its cost in "
                          "power), and for the explain scope whether the margin raised the p-value")
    spoof_suspected: bool | None = Field(
        None, description="watermarked kgw: and synthid: verdicts: the text's greens (or high unit scores) sit "
                          "on the units the service's own output made learnable, as a watermark thief's do (p <= "
                          "1e-3 under the key's own outputs); None when it cannot judge (too few units, too "
                          "little recorded output, or a gumbel: key, where the check has no measured power). Negative "
                          "verdicts under a two-part key: the public half says watermarked and the private "
                          "half says it was spoofed (paired test, p <= 1e-3)")
    spoof_check: dict[str, Any] | None = Field(
        None, description="explain scope: the spoof check's z, p-values (normal fit, empirical), units and null size")
    matches_own_output: bool | None = Field(
        None, description="kgw:, gumbel: and synthid: keys whose outputs the service remembers: the text repeats "
                          "the wording of one output the service wrote under a tested key (at least 8 of its sampled "
                          "5-grams are that output's alone), as edited or scrubbed output still does; it never "
                          "changes the verdict. None when no tested key has remembered outputs")
    paraphrase_of_own_output: dict[str, Any] | None = Field(None, description=PARAPHRASE_FIELD)
    own_output: dict[str, Any] | None = Field(
        None, description="explain scope: matched, the sampled 5-grams the text shares with its best-matching "
                          "remembered output, the text's sampled 5-grams, and the match threshold")
    public_half: dict[str, Any] | None = Field(
        None, description="explain scope, two-part keys: the public half's verdict, counts and z, and the paired "
                          "test of the two halves (a spoof made with the public half is green under it only)")
    explanation: list[dict[str, Any]] | None = None


class PublicKeyDocument(BaseModel):
    """The publishable half of a two-part key (``watermark.public_key.PublicKey``): verify text with it offline,
    ``provmark detect --public-half FILE``. Anyone holding it can also write text that passes it; the key's
    owner tells such spoofs apart with the private half (``spoof_suspected`` on its verdicts)."""

    key_id: str
    spec: str
    vocab_size: int
    tokenizer_fingerprint: str
    model_id: str
    detection_half: str = Field(description="64 hex digits: the public half's PRF key (never the private half)")
    fingerprint: str
    calibration: dict[str, Any] | None = Field(None, description="the public half's measured null on human text")
    format: str


class VerdictItem(BaseModel):
    """One stored verdict: whole for a token with ``explain`` (``disclosure`` "exact"); for ``audit`` alone the
    detect-scope view the row recorded (verdict, coarse z and p; no counts), or "withheld" (nulls) if none."""

    id: str
    created_at: str
    text_sha256: str
    verdict: VerdictName | None
    z: float | None
    p_value: float | None
    green_count: int | None
    scored_count: int | None
    green_fraction: float | None
    spec: str
    spec_fingerprint: str
    tokenizer_fingerprint: str
    key_id: str | None
    options: dict[str, Any]
    windows: dict[str, Any] | None
    receipt_id: str | None
    caller_token_id: str | None
    caller_name: str | None
    text: str | None
    disclosure: str = Field(description='"exact", "coarse-dithered/v1" (detector.disclosure) or "withheld"')


class VerdictList(BaseModel):
    """A page of verdicts, newest first; pass ``next_cursor`` as ``cursor`` for the next one."""

    items: list[VerdictItem]
    next_cursor: str | None


class VerdictQuery(StrictModel):
    since: datetime | None = Field(None, description="inclusive, ISO 8601 (naive times are UTC)")
    until: datetime | None = Field(None, description="exclusive, ISO 8601 (naive times are UTC)")
    verdict: VerdictName | None = None
    key_id: str | None = Field(None, max_length=32)
    min_z: float | None = Field(None, allow_inf_nan=False)
    text_sha256: str | None = Field(None, pattern="^[0-9a-f]{64}$")
    cursor: str | None = Field(None, min_length=1, max_length=200, pattern="^[A-Za-z0-9_-]+$",
                               description="opaque: the next_cursor of the previous page, as given (422 otherwise)")
    limit: int = Field(100, ge=1, le=MAX_PAGE_SIZE)
    format: Literal["json", "csv"] | None = Field(None, description="csv: the whole filtered list as CSV")

    @field_validator("since", "until")
    @classmethod
    def _as_utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        try:
            return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        except OverflowError:
            raise ValueError("out of range once converted to UTC") from None

    def filters(self) -> VerdictFilter:
        """The filters for ``Store.list_verdicts`` / ``verdicts_csv``."""
        return VerdictFilter(**self.model_dump(exclude={"format", "cursor", "limit"}))


class AuditEventItem(BaseModel):
    """One hash-chained audit event."""

    seq: int
    event_id: str
    kind: str
    actor: str
    subject_id: str | None
    created_at: str
    details: dict[str, Any]
    prev_hash: str | None = Field(description="null for a token without explain (routes_audit)")
    hash: str | None = Field(description="null for a token without explain (routes_audit)")


class AuditList(BaseModel):
    """Audit events in chain order; pass ``next_after_seq`` as ``after_seq`` for the next page."""

    items: list[AuditEventItem]
    next_after_seq: int | None


class AuditQuery(StrictModel):
    after_seq: int = Field(0, ge=0, le=MAX_SEQ)
    limit: int = Field(100, ge=1, le=MAX_PAGE_SIZE)
    kind: str | None = Field(None, max_length=40)
    subject_id: str | None = Field(None, max_length=64)


class AuditProblemItem(BaseModel):
    seq: int | None
    event_id: str | None
    problem: Literal["edited", "deleted", "reordered", "head_mismatch", "row_edited", "row_deleted", "row_unlogged",
                     "leaf_mismatch", "tree_head_mismatch", "tree_head_signature"]
    message: str


class AuditReportBody(BaseModel):
    """The audit chain check: ok, or every edited, deleted or reordered event, and every verdict or
    receipt row that was edited, deleted or added outside the service."""

    ok: bool
    events: int
    head_seq: int
    head_hash: str | None = Field(description="null for a token without explain (routes_audit)")
    rows_checked: int = Field(description="verdict and receipt rows compared with their audit events")
    rows_partly_covered: int = Field(description="of those, rows whose event predates row digests: "
                                                 "only the fields it carried were compared")
    tree_heads_checked: int = Field(0, description="kept signed tree heads of the transparency log compared with "
                                                   "the events and checked under the log key")
    problems: list[AuditProblemItem]


class Health(BaseModel):
    """The service is up and its database answers."""

    status: Literal["ok"]
    service: str
    database: str
    model_id: str


# ---- the transparency log (api/detector/routes_log.py; formats: provenance.tree_head, provenance.proof_bundle) ----

MAX_LOG_SIZE = 2**63 - 1  # tree sizes are uint64 on the wire and BIGINT in the table


class TreeHeadBody(BaseModel):
    """A signed tree head: Ed25519 over the RFC 9162 TreeHeadDataV2 bytes, and the same head as a C2SP checkpoint."""

    tree_size: int
    timestamp: int = Field(description="milliseconds since the epoch, as signed")
    root_hash: str = Field(description="base64")
    root_hash_hex: str
    signature: str = Field(description="base64 Ed25519 over TreeHeadDataV2 (51 bytes, docs/transparency-log.md)")
    key_id: str = Field(description="the log key's RFC 7638 JWK thumbprint")
    log_id: str = Field(description="base64 SHA-256 of the log key's DER SubjectPublicKeyInfo")
    checkpoint: str = Field(description="the C2SP tlog-checkpoint signed note")


class InclusionQuery(StrictModel):
    id: str = Field(min_length=1, max_length=64, description="an event's seq, event id, or subject id (receipt, "
                                                             "verdict, manifest or key id: its newest event)")
    tree_size: int | None = Field(None, ge=1, le=MAX_LOG_SIZE, description="a kept head's size (default: the newest "
                                                                          "kept head that contains the event)")


class InclusionProofBody(BaseModel):
    """An event's inclusion in the log: its exact entry bytes, its leaf index, the RFC 9162 path and the signed head."""

    type: Literal["inclusion"]
    entry: str = Field(description="base64 of the exact leaf entry bytes (leaf hash = SHA-256(0x00 || entry))")
    entry_json: dict[str, Any]
    leaf_index: int
    tree_size: int
    inclusion_path: list[str] = Field(description="base64 node hashes, from the leaf upwards")
    tree_head: TreeHeadBody


class ConsistencyQuery(StrictModel):
    first: int = Field(ge=1, le=MAX_LOG_SIZE, description="a kept head's size")
    second: int = Field(ge=1, le=MAX_LOG_SIZE, description="a kept head's size, at least first")


class ConsistencyProofBody(BaseModel):
    """That the log at the second head's size extends the log at the first's: the RFC 9162 path and both heads."""

    type: Literal["consistency"]
    first_size: int
    second_size: int
    consistency_path: list[str] = Field(description="base64 node hashes")
    first_head: TreeHeadBody
    second_head: TreeHeadBody


class LogPublicKeyBody(BaseModel):
    """The transparency log's Ed25519 public key, in every form a verifier may want."""

    key_id: str = Field(description="RFC 7638 thumbprint; every head's key_id")
    log_id: str
    origin: str = Field(description="the checkpoint's origin line and the note key's name")
    jwk: dict[str, Any] = Field(description="kty OKP, crv Ed25519, kid = key_id")
    jwks: dict[str, Any]
    pem: str
    verifier_key: str = Field(description="the C2SP signed-note verifier key: name+keyhash+base64(0x01 || key)")
