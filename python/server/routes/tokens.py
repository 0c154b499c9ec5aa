"""POST /tokenize and /detokenize, as vLLM names and shapes them: a client counts a prompt against
the context (`max_model_len`) before it sends it. A `prompt` is tokenized as /v1/completions
tokenizes it; `messages` (with `tools` and `chat_template_kwargs`) through the chat template as
/v1/chat/completions renders them, so `count` is the prompt_tokens a request would report. A prompt
is counted at any length (the body limit bounds it); a chat as the chat route counts it, so one that
must exceed the context before it is tokenized gets its context_length_exceeded. Behind the API key like /v1."""
from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field, model_validator

from ..errors import ApiError
from ..request_body import JsonRoute
from ..schemas import ChatCompletionRequest, Message, Strict, Tool
from .chat import chat_plan

router = APIRouter(route_class=JsonRoute)


class TokenizeRequest(Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = Field(default=None, min_length=1)
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_form(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send either 'prompt' (text) or 'messages' (a chat)")
        if self.prompt is not None and (self.tools or self.chat_template_kwargs):
            raise ValueError("'tools' and 'chat_template_kwargs' go with 'messages'")
        return self


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[int]


def ready(request: Request, model: str | None):
    state = request.app.state.trellisforge
    state.require_ready(model if model is not None else state.config.model_name)
    return state


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request):
    state = ready(request, body.model)
    if body.prompt is not None:
        tokens = await asyncio.to_thread(state.tokenizer.encode, body.prompt)  # counted at any length
    else:
        chat = ChatCompletionRequest(model=state.config.model_name, messages=body.messages, tools=body.tools,
                                     chat_template_kwargs=body.chat_template_kwargs)
        (tokens,) = (await chat_plan(state, chat)).prompts
    return {"count": len(tokens), "max_model_len": state.engine.context_tokens_max, "tokens": tokens, "token_strs": None}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request):
    state = ready(request, body.model)
    outside = [t for t in body.tokens if not 0 <= t < state.engine.vocab_size]
    if outside:
        raise ApiError(400, f"tokens: token id {outside[0]} is not in [0, {state.engine.vocab_size})", param="tokens",
                       code="token_out_of_vocabulary")
    return {"prompt": state.tokenizer.decode(body.tokens)}
