"""One settings object for both services: every ``PROVMARK_*`` variable, read once and checked at the door.

Each setting comes from the app's ``config`` (lower-case name), else the environment variable, else
its default; a bad value is a ValueError naming the variable and the setting. A service reads the
fields it uses and ignores the rest.

    setting          variable                   default, meaning                                     used by
    home             PROVMARK_HOME              ~/.local/share/provmark: keyring, SQLite, admin.token  both
    database_url     PROVMARK_DATABASE_URL      SQLite in home (WAL mode)                              both
    max_text_chars   PROVMARK_MAX_TEXT_CHARS    100000 characters of text or prompt (above: 413)       both
    rate_limit       PROVMARK_RATE_LIMIT        600 requests/minute per token and process (0: none)    both
    rate_burst       PROVMARK_RATE_BURST        requests a token may make at once (the rate)           both
    retain_text      PROVMARK_RETAIN_TEXT       1: store detected texts with verdicts (hashes only)    detector
    detect_budget    PROVMARK_DETECT_BUDGET     text tokens scored per token and UTC day (db.budget)   detector
    remembered_outputs
                     PROVMARK_REMEMBERED_OUTPUTS  16000: the newest outputs per key whose wording a  detector
                                                worker recognises (matches_own_output; 0: none)
    semantic_outputs PROVMARK_SEMANTIC_OUTPUTS  1000000: the newest outputs per key whose words the      both
                                                service keeps (paraphrase_of_own_output; 0: off)
    model            PROVMARK_MODEL             a local Hugging Face folder or GGUF file (SmolLM2)     generation
    device           PROVMARK_DEVICE            cpu, cuda, cuda:1 ... (cuda when present)              generation
    dtype            PROVMARK_DTYPE             float32, bfloat16, float16 (float32 on CPU)            generation
    weights          PROVMARK_WEIGHTS           float (the dtype's) or int8 (opt-in, CPU, float32)     generation
    max_num_seqs     PROVMARK_MAX_NUM_SEQS      64 sequences per engine step (the KV pool: paged)       generation
    max_pending      PROVMARK_MAX_PENDING       256 requests in flight before 503                      generation
    issuer           PROVMARK_ISSUER            http://127.0.0.1:8000: the ``iss`` of receipts, where  generation
                                                its JWKS is (/.well-known/jwks.json)
    detector_url     PROVMARK_DETECTOR_URL      http://127.0.0.1:8001: the detection tool that        generation
                                                receipts and C2PA manifests point to
    c2pa_cert_chain  PROVMARK_C2PA_CERT_CHAIN   PEM chain signing C2PA manifests, signing cert first   generation
                                                (unset: the deployment's development CA)
    c2pa_private_key PROVMARK_C2PA_PRIVATE_KEY  its PEM private key (Ed25519 or P-256); with the chain generation
    c2pa_tsa_url     PROVMARK_C2PA_TSA_URL      an RFC 3161 time-stamp authority for manifests         generation
    c2pa_trust_anchors
                     PROVMARK_C2PA_TRUST_ANCHORS  PEM roots a manifest must chain to to be Trusted     both
                                                (unset: the development root; required with a chain)
    identity         PROVMARK_IDENTITY          the deployment id a replica must find in the database  both
                                                (unset: any; `provmark identity show` prints it)
    log_head_interval
                     PROVMARK_LOG_HEAD_INTERVAL  2 seconds between signed log heads while the log     generation
                                                grows (0: none; `provmark log sign` signs one)

The variables read elsewhere (the master key, caches, kernels, metrics) are listed in ``READ_ELSEWHERE``.
Both tables make the settings reference of the documentation (docs/gen_reference.py), and
tests/test_docs.py checks that every ``PROVMARK_*`` name in the code is in one of them.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from db.budget import DEFAULT_DAILY_TOKENS
from db.output_memory import GRAMS_KEPT
from db.receipts import DEFAULT_ISSUER
from db.semantic_memory import DEFAULT_KEEP as SEMANTIC_KEPT
from provenance.c2pa_credential import C2paCredentialError, C2paSettings
from watermark.paths import provmark_home

ENV_PREFIX = "PROVMARK_"
WEIGHT_FORMS = ("float", "int8")  # the engine's linears: the model dtype's weights, or the opt-in int8 ones
DEFAULT_MAX_TEXT_CHARS = 100_000
DEFAULT_RATE_LIMIT = 600.0  # requests/minute per token: ten a second, far above a person pasting
DEFAULT_MAX_PENDING = 256  # requests queued or running at once before the engine worker refuses (503)
DEFAULT_DETECTOR_URL = "http://127.0.0.1:8001"  # the detector of `make serve`
DEFAULT_LOG_HEAD_INTERVAL_S = 2.0  # how stale the newest signed head may be while the log grows
_IDENTITY_RE = re.compile(r"[0-9a-f]{16}")

# Variables read outside Settings: variable -> (default, used by, meaning, read in).
READ_ELSEWHERE = {
    "PROVMARK_MASTER_KEY": ("unset", "both, CLI, vLLM plugin",
                            "the 32-byte master key (64 hex digits or base64url) that encrypts the keyring and seals "
                            "the deployment's signing keys; unset: a generated $PROVMARK_HOME/master.key (0600)",
                            "watermark/keyring_seal.py"),
    "PROVMARK_MODELS_DIR": ("$PROVMARK_HOME/models", "both, CLI", "the converted model and tokenizer cache",
                            "watermark/paths.py"),
    "PROVMARK_METRICS_TOKEN": ("unset", "both", "when set, GET /metrics needs this bearer token", "api/metrics.py"),
    "PROMETHEUS_MULTIPROC_DIR": ("unset", "both",
                                 "the folder where several gunicorn workers' metrics are summed; unset, "
                                 "provmark serve makes a private one per server", "api/serving.py"),
    "PROVMARK_COMPILE": ("1", "generation, CLI",
                         "0: the watermark bias without the torch.compile fused kernel (eager tensors) where the "
                         "C++ kernel is not used", "watermark/greenlist.py"),
    "PROVMARK_NATIVE": ("1", "both, CLI",
                        "0: no C/C++ kernel (engine, PRF, scoring pass, count tables); the Python and torch paths "
                        "give the same results, slower", "watermark/native_build.py, generation/cpu/native.py"),
    "PROVMARK_KERNEL_DIR": ("~/.cache/provmark/kernels", "both, CLI", "where the built C/C++ kernels are cached",
                            "watermark/native_build.py"),
    "PROVMARK_BATCH_TRANSPORT_KEY": ("set by detect-batch", "detect-batch --ray",
                                     "internal: the per-job key that seals key secrets for Ray workers; never set "
                                     "it yourself", "detector/batch_secrets.py"),
}


@dataclass(slots=True)
class Settings:
    """Both services' configuration (module docstring); values are checked when the object is made."""

    home: Path
    database_url: str | None = None
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    rate_limit: float = DEFAULT_RATE_LIMIT
    rate_burst: int | None = None
    retain_text: bool | None = None  # None: the store's own default (PROVMARK_RETAIN_TEXT)
    detect_budget: int = DEFAULT_DAILY_TOKENS
    remembered_outputs: int = GRAMS_KEPT
    semantic_outputs: int = SEMANTIC_KEPT
    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    weights: str = "float"
    max_num_seqs: int = 64
    max_pending: int = DEFAULT_MAX_PENDING
    issuer: str = DEFAULT_ISSUER
    detector_url: str = DEFAULT_DETECTOR_URL
    c2pa_cert_chain: Path | None = None
    c2pa_private_key: Path | None = None
    c2pa_tsa_url: str | None = None
    c2pa_trust_anchors: Path | None = None
    identity: str | None = None
    log_head_interval: float = DEFAULT_LOG_HEAD_INTERVAL_S

    def __post_init__(self) -> None:
        self.home = Path(self.home).expanduser()
        self.max_text_chars = _as_int("max_text_chars", self.max_text_chars, minimum=1)
        self.rate_limit = _as_float("rate_limit", self.rate_limit, minimum=0.0)
        if self.rate_burst is not None:
            self.rate_burst = _as_int("rate_burst", self.rate_burst, minimum=1)
        if isinstance(self.retain_text, str):
            self.retain_text = self.retain_text.strip().lower() in ("1", "true", "yes", "on")
        self.detect_budget = _as_int("detect_budget", self.detect_budget, minimum=0)
        self.remembered_outputs = _as_int("remembered_outputs", self.remembered_outputs, minimum=0)
        self.semantic_outputs = _as_int("semantic_outputs", self.semantic_outputs, minimum=0)
        self.weights = str(self.weights).strip().lower()
        if self.weights not in WEIGHT_FORMS:
            raise ValueError(f"{_variable('weights')}: expected one of {', '.join(WEIGHT_FORMS)}, got {self.weights!r}")
        self.max_num_seqs = _as_int("max_num_seqs", self.max_num_seqs, minimum=1)
        self.max_pending = _as_int("max_pending", self.max_pending, minimum=1)
        self.issuer = _as_url("issuer", self.issuer)
        self.detector_url = _as_url("detector_url", self.detector_url)
        for name in ("c2pa_cert_chain", "c2pa_private_key", "c2pa_trust_anchors"):
            if getattr(self, name) is not None:
                setattr(self, name, Path(getattr(self, name)).expanduser())
        if self.c2pa_tsa_url is not None:
            self.c2pa_tsa_url = _as_url("c2pa_tsa_url", self.c2pa_tsa_url)
        if self.identity is not None and not _IDENTITY_RE.fullmatch(str(self.identity)):
            raise ValueError(f"{_variable('identity')}: expected 16 hex digits (`provmark identity show`), "
                             f"got {self.identity!r}")
        self.log_head_interval = _as_float("log_head_interval", self.log_head_interval, minimum=0.0)

    def c2pa(self) -> C2paSettings:
        """The C2PA credential settings (``provenance.c2pa_credential``); a bad combination is a ValueError."""
        try:
            return C2paSettings(cert_chain=self.c2pa_cert_chain, private_key=self.c2pa_private_key,
                                tsa_url=self.c2pa_tsa_url, trust_anchors=self.c2pa_trust_anchors)
        except C2paCredentialError as error:
            raise ValueError(str(error)) from None

    @classmethod
    def load(cls, config: dict[str, Any] | None = None) -> Settings:
        """The environment's ``PROVMARK_*`` values, then ``config``'s (other keys are ignored) on top."""
        names = [f.name for f in fields(cls)]
        values: dict[str, Any] = {}
        for name in names:
            raw = os.environ.get(ENV_PREFIX + name.upper())
            if raw not in (None, ""):
                values[name] = raw
        values.update({k: v for k, v in (config or {}).items() if k in names and v is not None})
        values.setdefault("home", provmark_home())
        return cls(**values)


def _variable(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()} ({name})"


def _as_int(name: str, value, minimum: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{_variable(name)}: expected an integer, got {value!r}") from None
    if isinstance(value, bool) or number < minimum:
        raise ValueError(f"{_variable(name)}: expected an integer >= {minimum}, got {value!r}")
    return number


def _as_float(name: str, value, minimum: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{_variable(name)}: expected a number, got {value!r}") from None
    if isinstance(value, bool) or not number >= minimum or math.isinf(number):
        raise ValueError(f"{_variable(name)}: expected a finite number >= {minimum}, got {value!r}")
    return number


def _as_url(name: str, value) -> str:
    text = str(value).strip().rstrip("/")
    if not text.startswith(("http://", "https://")) or len(text) > 200 or any(c.isspace() for c in text):
        raise ValueError(f"{_variable(name)}: expected an http(s) URL of at most 200 characters, got {value!r}")
    return text
