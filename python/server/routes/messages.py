"""Anthropic's Messages API (what Claude Code and the Anthropic SDKs speak): POST /v1/messages runs
as the chat request it translates to (messages_request.py) and answers as a message or its events
(messages_output.py); POST /v1/messages/count_tokens counts the prompt it would render. Errors keep
the OpenAI fields and add Anthropic's `"type": "error"` (errors.py), and the API key may come as
`x-api-key` (auth.py)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..cancellation import cancel_on_disconnect
from ..messages_output import Blocks
from ..messages_request import CountTokensRequest, MessagesRequest, as_chat
from ..request_body import JsonRoute
from ..serving import STREAM_HEADERS, finish_all, one_choice_events, start
from .chat import chat_plan

router = APIRouter(route_class=JsonRoute)


@router.post("/v1/messages")
@cancel_on_disconnect
async def messages(body: MessagesRequest, request: Request):
    state = request.app.state.trellisforge
    state.require_ready(body.model)
    chat = as_chat(body)
    handles, prompt_tokens = await start(state, chat, await chat_plan(state, chat))
    blocks = Blocks(state.config.model_name, prompt_tokens)
    if body.stream:
        return StreamingResponse(one_choice_events(state, handles[0], blocks.id, _Streamed(blocks)), media_type="text/event-stream",
                                 headers=STREAM_HEADERS)
    await finish_all(state, handles, blocks.id)
    (choice, _, _) = handles[0]
    blocks.cached_tokens = choice.cached_tokens
    blocks.feed({"delta": {"reasoning_content": choice.reasoning, "content": choice.text,
                           "tool_calls": [call.to_openai() for call in choice.tool_calls]}})
    blocks.finish(choice.finish_reason, choice.stops.matched, choice.tokens)
    return JSONResponse(blocks.final)


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request):
    state = request.app.state.trellisforge
    state.require_ready(body.model)
    chat = as_chat(body)
    (tokens,) = (await chat_plan(state, chat)).prompts
    return {"input_tokens": len(tokens)}


class _Streamed:
    """The Blocks of one streamed choice, as serving.one_choice_events drives them."""

    def __init__(self, blocks: Blocks):
        self.blocks = blocks
        self.start, self.feed, self.failed = blocks.start, blocks.feed, blocks.failed

    def finish(self, choice) -> list[str]:
        self.blocks.cached_tokens = choice.cached_tokens
        return self.blocks.finish(choice.finish_reason, choice.stops.matched, choice.tokens)
