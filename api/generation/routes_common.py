"""What every generation route shares: prompts to token ids, request fields to SamplingParams and a
Watermark (with errors that name the field the caller sent), the engine worker, signed receipts, and
server-sent events.

A finished generation gets its C2PA manifest and its JWS receipt (``api.generation.credentials``), stored
with their audit events in one transaction. Receipts require a key id and a spec fingerprint, so an
unwatermarked generation (or one under a public hf spec, which has no key) is signed with the
placeholders ``NO_KEY_ID`` / ``UNWATERMARKED_FINGERPRINT``.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields

from api.generation.credentials import DEFAULT_C2PA_MODE, Credentials, Issued
from api.generation.engine_worker import EngineWorker, GenerationFailed, WorkerUnavailable
from api.generation.own_output import OwnOutput
from api.http import ApiError, Auth, deprecated, error_body
from api.refusals import too_large
from db.rows import new_id
from db.semantic_memory import SemanticMemory
from db.store import Store
from generation.sample.params import SamplingParams
from generation.sample.sampling_stage import check_request
from watermark.config import SpecError
from watermark.field_error import FieldError
from watermark.key_binding import require_generation_bound
from watermark.key_info import InvalidKeyIdError, KeyNotFoundError, KeySpecError, validate_key_id
from watermark.sampling_common import SamplingWatermarkError
from watermark.scheme import generation_watermark

WATERMARK_OFF = "off"  # the request's watermark field: no watermark
LOGPROB_FLOOR = -9999.0  # JSON has no -inf; a token the sampler ruled out reports this (as vLLM does)
MAX_LOGPROBS = 20  # top alternatives per token, OpenAI's documented maximum for top_logprobs
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SAMPLING_FIELDS = frozenset(field.name for field in fields(SamplingParams))


def invalid_field(field: str, message: str) -> ApiError:
    """422 naming one request field, shaped like the validation errors of ``api.http.validate``."""
    return ApiError(422, "invalid_fields", f"invalid fields: {field} ({message})",
                    details=[{"field": field, "message": message}])


def error_from_value_error(exc: Exception, rename: dict[str, str] | None = None) -> ApiError:
    """422 for a SamplingParams / Engine.submit ValueError: a FieldError names its field (answered as the caller
    spelled it); any other is the body's."""
    if not isinstance(exc, FieldError):
        return invalid_field("(body)", str(exc))
    field = (rename or {}).get(exc.field, exc.field)
    if exc.field in SAMPLING_FIELDS:  # SamplingParams' reason starts with the value: "top_p=1.5: must be ..."
        return invalid_field(field, f"{field}={exc.reason}")
    return invalid_field(field, exc.reason)


@dataclass(frozen=True, slots=True)
class GenerationServices:
    """What every generation blueprint is given, as the detector's are given their DetectorServices
    (``blueprint(api, services)``): the service (None where the routes are only documented) and the auth."""

    generation: GenerationService | None
    auth: Auth


@dataclass(slots=True)
class Started:
    """A request the engine accepted: its handle and what its receipt will say."""

    handle: object  # api.generation.engine_worker.GenerationHandle
    receipt_id: str
    created: int  # unix seconds (OpenAI's `created`)
    prompt_tokens: int


class GenerationService:
    """The engine worker plus what a route needs around it; one per app."""

    def __init__(self, worker: EngineWorker, store: Store, keyring, credentials: Credentials, *,
                 model_id: str, max_prompt_chars: int, public_keys=None,
                 semantic: SemanticMemory | None = None) -> None:
        self.worker = worker
        self.public_keys = public_keys  # api.provenance_keys.PublicKeys: the JWKS every replica serves
        self.store = store
        self.keyring = keyring
        self.credentials = credentials
        self.signer = credentials.signer
        self.model_id = model_id
        self.model_names = frozenset({model_id, "default"})  # what the OpenAI `model` field may say
        self.started_at = int(time.time())  # OpenAI's model `created`
        self.max_prompt_chars = max_prompt_chars
        self.engine = worker.engine
        self.tokenizer = self.engine.tokenizer
        self.vocab_size = self.engine.vocab_size
        self._tokenizer_lock = threading.Lock()  # one Rust tokenizer shared by request threads
        # what each key wrote, for the detector's spoof check, own-output match and paraphrase match
        self.output_memory = OwnOutput(store, keyring, semantic)

    # ------------------------------------------------------------------ request -> engine inputs
    def prompt_ids(self, prompt, field: str = "prompt") -> list[int]:
        """Token ids of a text prompt (with the tokenizer's special tokens) or of given ids."""
        if isinstance(prompt, str):
            self._check_size(len(prompt), field)
            if not prompt:
                raise invalid_field(field, "empty prompt")
            with self._tokenizer_lock:
                return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        if not prompt:
            raise invalid_field(field, "empty prompt")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise invalid_field(field, f"token ids {bad[:5]} outside [0, {self.vocab_size})")
        return list(prompt)

    def chat_prompt_ids(self, messages: list[dict], field: str = "messages") -> list[int]:
        """Token ids of a chat by the model's own chat template, ready for the assistant's turn."""
        self._check_size(sum(len(m["content"]) for m in messages), field)
        try:
            with self._tokenizer_lock:
                return self.engine.apply_chat_template(messages)
        except Exception as exc:  # noqa: BLE001 - a template rejecting a conversation is the caller's error
            raise invalid_field(field, f"the chat template rejected these messages ({type(exc).__name__})") from None

    def _check_size(self, chars: int, field: str) -> None:
        if chars > self.max_prompt_chars:
            raise too_large(field, f"{field}: {chars} characters, above the limit of {self.max_prompt_chars}",
                            self.max_prompt_chars)

    def sampling_params(self, values: dict, rename: dict[str, str] | None = None) -> SamplingParams:
        """SamplingParams from field values; a bad one is a 422 naming the caller's field."""
        try:
            params = SamplingParams(**values)
            params.validate_for_vocab(self.vocab_size)
        except ValueError as exc:
            raise error_from_value_error(exc, rename) from None
        return params

    def request_watermark(self, req):
        """The Watermark a request asks for: ``watermark`` (a spec, "off", or absent for the key's own spec) and
        ``keys`` (one key id; absent: the active key), with the spellings deprecated for one release (null or
        false for "off", true for absent, ``key_id``) still taken and flagged (``api.http.deprecated``)."""
        asked = "watermark" in req.model_fields_set
        spec = req.watermark if asked else True
        if spec is None or spec is False:
            deprecated('watermark: null and false are deprecated; send "off"')
        elif spec is True and asked:
            deprecated("watermark: true is deprecated; leave watermark out for the key's own spec")
        if spec == WATERMARK_OFF or spec is None:
            spec = False
        key_field, key_id = "keys", req.keys[0] if req.keys else None
        if req.key_id is not None:
            if req.keys is not None:
                raise invalid_field("key_id", "give keys (key_id is its deprecated spelling), not both")
            deprecated("key_id is deprecated; send keys: [id]")
            key_field, key_id = "key_id", req.key_id
        return self.watermark(spec, key_id, key_field)

    def watermark(self, spec, key_id: str | None, key_field: str = "keys"):
        """The request's Watermark: ``spec`` True -> the key's own spec, False -> none, else a spec string;
        ``key_id`` None -> the active key. 422 for a bad spec or key id (naming ``key_field``), 404 for an
        unknown key."""
        if spec is False:
            if key_id is not None:
                raise invalid_field(key_field, "nothing to key: the request turns the watermark off")
            return None
        if key_id is not None:
            try:
                validate_key_id(key_id)
            except InvalidKeyIdError as exc:  # its message does not echo the value (it may be a pasted secret)
                raise invalid_field(key_field, str(exc)) from None
        try:
            mark = generation_watermark(None if spec is True else spec, self.vocab_size, key_id=key_id,
                                        keyring=self.keyring)
            require_generation_bound(mark, self.keyring)  # a key writes only its own colours
            return mark
        except SpecError as exc:
            raise invalid_field("watermark", str(exc)) from None
        except KeyNotFoundError as exc:
            raise ApiError(404, "key_not_found", str(exc)) from None
        except KeySpecError as exc:
            raise invalid_field(key_field, str(exc)) from None
        except FieldError as exc:  # an hf spec with a key id
            raise invalid_field(key_field, exc.reason) from None
        except ValueError as exc:
            raise invalid_field(key_field, str(exc)) from None

    # ------------------------------------------------------------------ running
    def start(self, prompt_ids: list[int], params: SamplingParams, watermark, *, streaming: bool,
              rename: dict[str, str] | None = None) -> Started:
        try:
            check_request(watermark, params)
        except SamplingWatermarkError as exc:  # greedy under gumbel/synthid, or vllm:gumbel: never unwatermarked
            raise ApiError(400, "watermark_needs_sampling", str(exc)) from None
        try:
            handle = self.worker.submit(prompt_ids, params, watermark, streaming=streaming)
        except WorkerUnavailable as exc:
            raise ApiError(503, "engine_unavailable", str(exc), headers={"Retry-After": "5"}) from None
        except ValueError as exc:
            raise error_from_value_error(exc, rename) from None
        return Started(handle, new_id(), int(time.time()), len(prompt_ids))

    def finish(self, started: Started):
        """Wait for the finished output (non-streaming requests)."""
        try:
            return started.handle.result()
        except WorkerUnavailable as exc:
            raise ApiError(503, "engine_unavailable", str(exc), headers={"Retry-After": "5"}) from None
        except GenerationFailed as exc:
            raise ApiError(500, "generation_failed", str(exc)) from None

    def issue(self, out, started: Started, actor: str, c2pa_mode: str = DEFAULT_C2PA_MODE) -> Issued:
        """Sign and store the finished output's C2PA manifest and receipt (with their audit events, one
        transaction), and remember the output's units for the spoof check (``api.generation.own_output``)."""
        self.output_memory.remember(out.watermark, out.token_ids, self.engine.loaded.vocab, out.text,
                                    out.prompt_token_ids, started.receipt_id)
        return self.credentials.issue(out, started.receipt_id, actor, c2pa_mode)

    # ------------------------------------------------------------------ output pieces
    @staticmethod
    def watermark_info(out) -> dict | None:
        mark = out.watermark
        return None if mark is None else {"spec": mark.spec, "key_id": mark.key_id,
                                          "spec_fingerprint": mark.fingerprint, "fingerprint": mark.fingerprint}

    @staticmethod
    def usage(out) -> dict:
        return {"prompt_tokens": out.usage.prompt_tokens, "completion_tokens": out.usage.completion_tokens,
                "total_tokens": out.usage.total_tokens}

    def token_text(self, token_id: int) -> str:
        with self._tokenizer_lock:
            return self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def token_logprobs(self, out, start: int = 0) -> list[dict]:
        """Per generated token from ``start``: its id, text, logprob and the top alternatives (pre-watermark)."""
        if out.logprobs is None:
            return []
        items = []
        for token_id, logprob, top in zip(out.token_ids[start:], out.logprobs[start:], out.top_logprobs[start:]):
            items.append({"token_id": token_id, "token": self.token_text(token_id), "logprob": finite(logprob),
                          "top_logprobs": [{"token_id": t, "token": self.token_text(t), "logprob": finite(lp)}
                                           for t, lp in top]})
        return items


def finite(value: float) -> float:
    return float(value) if math.isfinite(value) else LOGPROB_FLOOR


def sse(data) -> str:
    """One server-sent event carrying ``data`` (JSON, or a literal such as ``[DONE]``)."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n"


def sse_error(exc: Exception) -> str:
    if isinstance(exc, WorkerUnavailable):
        code = "engine_unavailable"
    elif isinstance(exc, GenerationFailed):
        code = "generation_failed"
    else:
        code = "internal_error"
    message = str(exc) if isinstance(exc, (WorkerUnavailable, GenerationFailed)) else "internal error"
    return sse(error_body(503 if code == "engine_unavailable" else 500, code, message))


def stream_outputs(started: Started) -> Iterator:
    """The request's outputs; closing the iterator (client gone) cancels the request."""
    finished = False
    try:
        for out in started.handle.outputs():
            finished = out.finished
            yield out
    finally:
        if not finished:
            started.handle.cancel()


def stop_list(stop: str | Iterable[str] | None) -> list[str] | None:
    if stop is None:
        return None
    return [stop] if isinstance(stop, str) else list(stop)
