"""POST /v1/generate: provmark's own generation API, every sampler field under SamplingParams' names.

Body: ``prompt`` (text or token ids) or ``messages`` (chat), the SamplingParams fields, ``watermark``
(a spec string, "off" for none, absent for the key's own spec) with ``keys`` (one key id), and ``stream``. Answer:
text, token ids, finish reason, usage, watermark, the signed receipt, and logprobs when asked.
``c2pa`` says how the text's C2PA manifest travels (``api.generation.credentials``); the answer's ``c2pa``
says where it is. ``stream: true`` answers with server-sent events: ``{"delta": ...}`` pieces, then one
event with ``finish_reason``, ``usage``, ``watermark``, ``receipt`` and ``c2pa`` (its delta ends with the
manifest's wrapper when it is embedded), then ``[DONE]``.
"""

from __future__ import annotations

import logging

from flask import Blueprint, Response, g, jsonify
from pydantic import BaseModel, ConfigDict, Field

from api.generation.credentials import Issued
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
    C2paInfo,
    ChatMessage,
    LogitBias,
    NonEmptyText,
    Receipt,
    SamplerFields,
    Stops,
    TokenIds,
    Usage,
    WatermarkInfo,
    logit_bias_values,
)
from api.http import parse_body

log = logging.getLogger(__name__)
DIRECT_FIELDS = (
    "max_new_tokens", "min_new_tokens", "temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff",
    "eta_cutoff", "mirostat_mode", "mirostat_tau", "mirostat_eta", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "no_repeat_ngram_size", "bad_words_ids", "stop_token_ids", "ignore_eos", "seed", "logprobs",
)


class GenerateRequest(SamplerFields):
    """A generation request: ``prompt`` or ``messages``, sampler fields, watermark, stream."""

    # exactly one of prompt / messages, stated in the schema too
    model_config = ConfigDict(extra="forbid", json_schema_extra={"oneOf": [
        {"required": ["prompt"], "properties": {"prompt": {"not": {"type": "null"}}}},
        {"required": ["messages"], "properties": {"messages": {"not": {"type": "null"}}}}]})

    prompt: NonEmptyText | TokenIds | None = Field(None, description="the prompt text, or its token ids")
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=MAX_LIST,
                                               description="a chat, rendered by the model's chat template")
    max_new_tokens: int = Field(128, ge=1, le=MAX_NEW_TOKENS)
    min_new_tokens: int = Field(0, ge=0, le=MAX_NEW_TOKENS,
        description="no end-of-text before this many tokens; at most the maximum tokens (422 otherwise)")
    temperature: float = Field(1.0, ge=0.0, le=MAX_TEMPERATURE, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass (1 = off)")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: LogitBias | None = Field(None, description="token id -> bias in [-100, 100]")
    stop: Stops | None = Field(None, description="stop string(s), not included in the text")
    seed: int | None = Field(None, ge=0, le=SEED_LIMIT, description="the same seed gives the same tokens")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS,
                                 description="report each token's logprob and this many top alternatives")
    stream: bool = Field(False, description="answer with server-sent events")


class TopLogprob(BaseModel):
    token_id: int
    token: str
    logprob: float


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class GenerateResponse(BaseModel):
    """A finished generation with its signed receipt."""

    id: str
    model: str
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    watermark: WatermarkInfo | None
    receipt: Receipt
    c2pa: C2paInfo | None = None
    logprobs: list[TokenLogprob] | None = None


def blueprint(api, services: GenerationServices) -> Blueprint:
    """The generate routes, registered on the app as the detector's route modules are."""
    bp = Blueprint("generate", __name__)

    @api.route(bp, "/v1/generate", methods=["POST"], summary="Generate (watermarked) text", body=GenerateRequest,
               responses={200: GenerateResponse, 404: "unknown watermark key",
                          413: "prompt above the size limit", 500: "the engine failed"},
               scope="generate", tags=["generation"])
    @services.auth.require("generate")
    def generate():
        req = parse_body(GenerateRequest)
        service = services.generation
        if (req.prompt is None) == (req.messages is None):
            raise invalid_field("prompt", "give exactly one of prompt or messages")
        prompt_ids = (service.prompt_ids(req.prompt) if req.prompt is not None
                      else service.chat_prompt_ids([m.as_template_message() for m in req.messages]))
        values = {name: getattr(req, name) for name in DIRECT_FIELDS if name in req.model_fields_set}
        values["stop"] = stop_list(req.stop)
        values["logit_bias"] = logit_bias_values(req.logit_bias)
        params = service.sampling_params({k: v for k, v in values.items() if v is not None})
        mark = service.request_watermark(req)
        started = service.start(prompt_ids, params, mark, streaming=req.stream)
        actor = g.token.caller.actor
        if req.stream:
            return Response(_events(service, started, actor, req.c2pa), mimetype="text/event-stream",
                            headers=SSE_HEADERS)
        out = service.finish(started)
        return jsonify(_body(service, out, started, service.issue(out, started, actor, req.c2pa), with_logprobs=True))

    return bp

def _body(service, out, started, issued: Issued, with_logprobs: bool) -> dict:
    body = {"id": started.receipt_id, "model": service.model_id, "text": issued.text, "token_ids": out.token_ids,
            "finish_reason": out.finish_reason, "usage": service.usage(out),
            "watermark": service.watermark_info(out), "receipt": issued.receipt, "c2pa": issued.c2pa}
    if with_logprobs and out.logprobs is not None:
        body["logprobs"] = service.token_logprobs(out)
    return body


def _events(service, started, actor: str, c2pa_mode: str):
    sent = 0  # tokens whose ids (and logprobs) went out already
    outputs = stream_outputs(started)
    try:
        for out in outputs:
            if not out.text_delta and not out.finished:
                continue
            event = {"delta": out.text_delta, "token_ids": out.token_ids[sent:]}
            if out.logprobs is not None:
                event["logprobs"] = service.token_logprobs(out, sent)
            sent = len(out.token_ids)
            if out.finished:
                issued = service.issue(out, started, actor, c2pa_mode)
                event.update({k: v for k, v in _body(service, out, started, issued, False).items()
                              if k not in ("text", "token_ids")})
                event["delta"] = out.text_delta + issued.stream_suffix  # an embedded manifest ends the text
            yield sse(event)
        yield sse("[DONE]")
    except Exception as exc:
        log.exception("generation stream failed")
        yield sse_error(exc)
    finally:
        outputs.close()  # a client that left cancels its request
