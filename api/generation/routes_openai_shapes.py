"""OpenAI's response bodies and stream chunks for the OpenAI-compatible routes (api/generation/openai_compat.py):
the pydantic models the OpenAPI document shows, and the shapes that build ``text_completion``,
``chat.completion`` and ``chat.completion.chunk`` objects from engine outputs."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from api.generation.routes_models import Provenance, Usage


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class CompletionResponse(BaseModel):
    """An OpenAI ``text_completion`` (with a ``provmark`` receipt)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    provmark: Provenance | None = None


class ChatLogprobTop(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatLogprob(ChatLogprobTop):
    top_logprobs: list[ChatLogprobTop]


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatLogprob] | None
    refusal: list[ChatLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatChoiceLogprobs | None
    finish_reason: str | None


class ChatCompletionResponse(BaseModel):
    """An OpenAI ``chat.completion`` (with a ``provmark`` receipt)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    provmark: Provenance


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    """The models this service generates with (OpenAI's list shape)."""

    object: Literal["list"]
    data: list[ModelCard]


class CompletionShape:
    """``text_completion`` bodies and chunks."""

    def __init__(self, service, req, started) -> None:
        self.service, self.req, self.started = service, req, started
        self.id = f"cmpl-{started.receipt_id}"
        self.emitted = 0  # characters streamed so far: where the next chunk's tokens start

    def chunk_header(self) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.started.created,
                "model": self.service.model_id, "system_fingerprint": None}

    def logprobs(self, out, start: int, position: int = 0) -> dict | None:
        """OpenAI's completion logprobs; text offsets count each token's decoded length from ``position``."""
        if out.logprobs is None:
            return None
        items = self.service.token_logprobs(out, start)
        offsets = []
        for item in items:
            offsets.append(position)
            position += len(item["token"])
        return {"tokens": [i["token"] for i in items], "token_logprobs": [i["logprob"] for i in items],
                "top_logprobs": [{t["token"]: t["logprob"] for t in i["top_logprobs"]} for i in items],
                "text_offset": offsets}

    def whole(self, out, provenance: dict, text: str) -> dict:
        choice = {"text": text, "index": 0, "logprobs": self.logprobs(out, 0), "finish_reason": out.finish_reason}
        return {**self.chunk_header(), "choices": [choice], "usage": self.service.usage(out), "provmark": provenance}

    def first_chunk(self) -> dict | None:
        return None

    def chunk(self, out, start: int, suffix: str = "", **extra) -> dict:
        choice = {"text": out.text_delta + suffix, "index": 0, "logprobs": self.logprobs(out, start, self.emitted),
                  "finish_reason": out.finish_reason if out.finished else None}
        self.emitted += len(out.text_delta) + len(suffix)
        return {**self.chunk_header(), "choices": [choice], **extra}


class ChatShape:
    """``chat.completion`` bodies and ``chat.completion.chunk`` chunks."""

    def __init__(self, service, req, started) -> None:
        self.service, self.req, self.started = service, req, started
        self.id = f"chatcmpl-{started.receipt_id}"

    def chunk_header(self) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.started.created,
                "model": self.service.model_id, "system_fingerprint": None}

    def logprobs(self, out, start: int) -> dict | None:
        if out.logprobs is None:
            return None
        return {"content": [{"token": i["token"], "logprob": i["logprob"], "bytes": list(i["token"].encode()),
                             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"],
                                               "bytes": list(t["token"].encode())} for t in i["top_logprobs"]]}
                            for i in self.service.token_logprobs(out, start)], "refusal": None}

    def whole(self, out, provenance: dict, text: str) -> dict:
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                  "logprobs": self.logprobs(out, 0), "finish_reason": out.finish_reason}
        return {**self.chunk_header(), "object": "chat.completion", "choices": [choice],
                "usage": self.service.usage(out), "provmark": provenance}

    def first_chunk(self) -> dict:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return {**self.chunk_header(), "choices": [choice]}

    def chunk(self, out, start: int, suffix: str = "", **extra) -> dict:
        content = out.text_delta + suffix
        delta = {"content": content} if content or not out.finished else {}
        choice = {"index": 0, "delta": delta, "logprobs": self.logprobs(out, start),
                  "finish_reason": out.finish_reason if out.finished else None}
        return {**self.chunk_header(), "choices": [choice], **extra}
