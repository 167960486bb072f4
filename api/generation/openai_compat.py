"""OpenAI-compatible routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models.

Requests take OpenAI's fields (model, prompt / messages, max_tokens / max_completion_tokens,
temperature, top_p, n, stop, stream, stream_options.include_usage, logprobs / top_logprobs, seed,
presence_penalty, frequency_penalty, logit_bias, user) plus provmark's own, sent by OpenAI clients
through ``extra_body``: watermark, keys, c2pa, top_k, min_p, typical_p, min_tokens, repetition_penalty...
Fields neither API knows are ignored, as OpenAI clients send extras. Answers and stream chunks are
shaped as OpenAI's (``text_completion``, ``chat.completion``, ``chat.completion.chunk``, ``[DONE]``),
with one extra field ``provmark``: the signed receipt, the watermark and the C2PA manifest of the text
(bodies and chunks are built in api/generation/routes_openai_shapes.py).
"""

from __future__ import annotations

import logging
from typing import Annotated, TypeVar

from flask import Blueprint, Response, g, jsonify
from pydantic import BaseModel, ConfigDict, Field

from api.generation.routes_common import (
    MAX_LOGPROBS,
    SSE_HEADERS,
    GenerationServices,
    invalid_field,
    sse,
    sse_error,
    stop_list,
    stream_outputs,
)
from api.generation.routes_models import (
    MAX_LIST,
    MAX_NEW_TOKENS,
    MAX_TEMPERATURE,
    SEED_LIMIT,
    ChatMessage,
    LogitBias,
    NonEmptyText,
    SamplerFields,
    Stops,
    TokenIds,
    logit_bias_values,
)
from api.generation.routes_openai_shapes import (
    ChatCompletionResponse,
    ChatShape,
    CompletionResponse,
    CompletionShape,
    ModelList,
)
from api.http import ApiError, parse_body

log = logging.getLogger(__name__)

T = TypeVar("T")
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's documented max_tokens default for /v1/completions
DEFAULT_CHAT_TOKENS = 512  # OpenAI's chat default is "the model's limit"; this keeps one answer bounded
MAX_N = 128  # OpenAI's documented upper bound for n (only n = 1 is served for now)
OnePrompt = Annotated[list[T], Field(min_length=1, max_length=1)]  # OpenAI's prompt list, one entry served
PASSED_THROUGH = ("top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "mirostat_mode", "mirostat_tau",
                  "mirostat_eta", "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "stop_token_ids",
                  "ignore_eos", "temperature", "top_p", "presence_penalty", "frequency_penalty", "seed")


class StreamOptions(BaseModel):
    include_usage: bool = False


class OpenAIRequest(SamplerFields):
    """Fields the two OpenAI endpoints share; unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(..., max_length=200, description="a model id from GET /v1/models")
    temperature: float = Field(1.0, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    # the document says 1; larger n get a 422 saying that only n = 1 is served for now
    n: int = Field(1, ge=1, le=MAX_N, json_schema_extra={"maximum": 1}, description="completions per prompt: only 1")
    stop: Stops | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(None, ge=0, le=SEED_LIMIT)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: LogitBias | None = None
    user: str | None = Field(None, max_length=256, description="an end-user id (not used; bounded)")
    min_tokens: int = Field(0, ge=0, le=MAX_NEW_TOKENS,
        description="no end-of-text before this many tokens; at most the maximum tokens (422 otherwise)")


class CompletionRequest(OpenAIRequest):
    """OpenAI's legacy completions request (one prompt, n = 1)."""

    prompt: NonEmptyText | TokenIds | OnePrompt[NonEmptyText] | OnePrompt[TokenIds] = Field(
        ..., description="one prompt: text or token ids (a list of one is accepted)")
    max_tokens: int | None = Field(DEFAULT_COMPLETION_TOKENS, ge=1, le=MAX_NEW_TOKENS)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = Field(False, description="only false is supported")


class ChatCompletionRequest(OpenAIRequest):
    """OpenAI's chat completions request (n = 1)."""

    messages: list[ChatMessage] = Field(..., min_length=1, max_length=MAX_LIST)
    max_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS, description="deprecated name of max_completion_tokens")
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


# ---------------------------------------------------------------------------------------- routes
def blueprint(api, services: GenerationServices) -> Blueprint:
    """The openai routes, registered on the app as the detector's route modules are."""
    bp = Blueprint("openai", __name__)

    errors = {404: "unknown model or watermark key", 413: "prompt above the size limit", 500: "the engine failed"}

    @api.route(bp, "/v1/completions", methods=["POST"], summary="OpenAI-compatible completion",
               body=CompletionRequest, responses={200: CompletionResponse, **errors}, scope="generate", tags=["openai"])
    @services.auth.require("generate")
    def completions():
        req = parse_body(CompletionRequest)
        service = services.generation
        _check_common(service, req)
        if req.echo:
            raise invalid_field("echo", "echo is not supported (only false)")
        prompt = req.prompt
        if prompt and isinstance(prompt[0], (str, list)) and not isinstance(prompt, str):
            if len(prompt) != 1:
                raise invalid_field("prompt", "only one prompt per request is supported; send one request per prompt")
            prompt = prompt[0]
        rename = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
        params = service.sampling_params(_sampler_values(req, req.max_tokens or DEFAULT_COMPLETION_TOKENS, req.logprobs),
                                         rename)
        return _run(service, req, service.prompt_ids(prompt), params, rename, chat=False)

    @api.route(bp, "/v1/chat/completions", methods=["POST"], summary="OpenAI-compatible chat completion",
               body=ChatCompletionRequest, responses={200: ChatCompletionResponse, **errors}, scope="generate",
               tags=["openai"])
    @services.auth.require("generate")
    def chat_completions():
        req = parse_body(ChatCompletionRequest)
        service = services.generation
        _check_common(service, req)
        if req.top_logprobs is not None and not req.logprobs:
            raise invalid_field("top_logprobs", "needs logprobs: true")
        limit_name = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        limit = req.max_completion_tokens or req.max_tokens or DEFAULT_CHAT_TOKENS
        rename = {"max_new_tokens": limit_name, "min_new_tokens": "min_tokens", "logprobs": "top_logprobs"}
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = service.sampling_params(_sampler_values(req, limit, logprobs), rename)
        prompt_ids = service.chat_prompt_ids([m.as_template_message() for m in req.messages])
        return _run(service, req, prompt_ids, params, rename, chat=True)

    @api.route(bp, "/v1/models", methods=["GET"], summary="The models served (OpenAI-compatible)",
               responses={200: ModelList}, scope="generate", tags=["openai"])
    @services.auth.require("generate")
    def models():
        service = services.generation
        card = {"id": service.model_id, "object": "model", "created": service.started_at, "owned_by": "provmark"}
        return jsonify({"object": "list", "data": [card]})

    return bp

def _check_common(service, req: OpenAIRequest) -> None:
    if req.model not in service.model_names:
        raise ApiError(404, "model_not_found", f"model {req.model[:200]!r} is not served here; see GET /v1/models")
    if req.n != 1:
        raise invalid_field("n", "only n = 1 is supported for now: send one request per completion")


def _sampler_values(req: OpenAIRequest, max_new_tokens: int, logprobs: int | None) -> dict:
    values = {name: getattr(req, name) for name in PASSED_THROUGH if name in req.model_fields_set}
    values.update(max_new_tokens=max_new_tokens, min_new_tokens=req.min_tokens, stop=stop_list(req.stop),
                  logit_bias=logit_bias_values(req.logit_bias), logprobs=logprobs)
    return {k: v for k, v in values.items() if v is not None}


def _run(service, req: OpenAIRequest, prompt_ids: list[int], params, rename: dict, chat: bool):
    mark = service.request_watermark(req)
    started = service.start(prompt_ids, params, mark, streaming=req.stream, rename=rename)
    actor = g.token.caller.actor
    shape = ChatShape(service, req, started) if chat else CompletionShape(service, req, started)
    if req.stream:
        return Response(_chunks(service, shape, started, actor, req), mimetype="text/event-stream",
                        headers=SSE_HEADERS)
    out = service.finish(started)
    issued = service.issue(out, started, actor, req.c2pa)
    return jsonify(shape.whole(out, _provenance(service, out, issued), issued.text))


def _provenance(service, out, issued) -> dict:
    return {"receipt": issued.receipt, "watermark": service.watermark_info(out), "c2pa": issued.c2pa}


def _chunks(service, shape, started, actor: str, req: OpenAIRequest):
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    sent = 0
    outputs = stream_outputs(started)
    try:
        first = shape.first_chunk()
        if first is not None:
            yield sse(first)
        for out in outputs:
            if not out.text_delta and not out.finished:
                continue
            issued = service.issue(out, started, actor, req.c2pa) if out.finished else None
            extra = {"provmark": _provenance(service, out, issued)} if issued is not None else {}
            chunk = shape.chunk(out, sent, suffix=issued.stream_suffix if issued is not None else "", **extra)
            if include_usage:
                chunk["usage"] = None
            sent = len(out.token_ids)
            yield sse(chunk)
            if out.finished and include_usage:
                yield sse({**shape.chunk_header(), "choices": [], "usage": service.usage(out)})
        yield sse("[DONE]")
    except Exception as exc:
        log.exception("completion stream failed")
        yield sse_error(exc)
    finally:
        outputs.close()  # a client that left cancels its request
