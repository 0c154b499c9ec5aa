"""Anthropic's Messages API (what Claude Code and the Anthropic SDKs speak): POST /v1/messages runs
as the chat request it translates to (messages_request.py) and answers as a message or its events
(messages_output.py); POST /v1/messages/count_tokens counts the prompt it would render. Errors keep
the OpenAI fields and add Anthropic's `"type": "error"` (errors.py), and the API key may come as
`x-api-key` (auth.py)."""
from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..cancellation import cancel_on_disconnect
from ..messages_output import Blocks
from ..messages_request import CountTokensRequest, MessagesRequest, as_chat
from ..request_body import JsonRoute
from ..serving import STREAM_HEADERS, finish_all, start
from .chat import chat_plan

router = APIRouter(route_class=JsonRoute)
log = logging.getLogger("trellisforge")


@router.post("/v1/messages")
@cancel_on_disconnect
async def messages(body: MessagesRequest, request: Request):
    state = request.app.state.trellisforge
    state.require_ready(body.model)
    chat = as_chat(body)
    handles, prompt_tokens = await start(state, chat, await chat_plan(state, chat))
    blocks = Blocks(state.config.model_name, prompt_tokens)
    if body.stream:
        return StreamingResponse(events(state, handles, blocks), media_type="text/event-stream", headers=STREAM_HEADERS)
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


async def events(state, handles, blocks: Blocks):
    (choice, sequence_id, queue) = handles[0]
    ended = False
    try:
        for event in blocks.start():
            yield event
        while not choice.done:
            item = await queue.get()
            for chunk in choice.take(item, state, choice.started):
                for event in blocks.feed(chunk):
                    yield event
        if choice.cancel_engine:
            state.runtime.cancel(sequence_id)
        ended = True
        if choice.failure:
            yield Blocks.failed(choice.failure)
        else:
            blocks.cached_tokens = choice.cached_tokens
            for event in blocks.finish(choice.finish_reason, choice.stops.matched, choice.tokens):
                yield event
    finally:
        if not ended:  # the client went away
            state.runtime.cancel(sequence_id)
            log.info("%s: the client left the stream; cancelled its sequence (499)", blocks.id)
        state.metrics.requests.labels("failed" if choice.failure else "completed" if ended else "cancelled").inc()
