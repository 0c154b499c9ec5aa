"""POST /v1/responses: the OpenAI Responses API (what Codex CLI and the Agents SDK speak), run as the
chat request it translates to (responses_request.py) and answered as response objects and events
(responses_output.py). Nothing is stored: every request carries its conversation."""
from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..cancellation import cancel_on_disconnect
from ..errors import ApiError
from ..request_body import JsonRoute
from ..responses_output import Items, usage
from ..responses_request import RESPONSES_NAMES, ResponsesRequest, as_chat
from ..serving import STREAM_HEADERS, finish_all, start
from .chat import chat_plan

router = APIRouter(route_class=JsonRoute)
log = logging.getLogger("trellisforge")


@router.post("/v1/responses")
@cancel_on_disconnect
async def responses(body: ResponsesRequest, request: Request):
    state = request.app.state.trellisforge
    state.require_ready(body.model)
    chat = as_chat(body)
    try:
        plan = await chat_plan(state, chat)
        handles, prompt_tokens = await start(state, chat, plan)
    except ApiError as error:  # the chat request's names for the Responses request's fields
        if error.param:
            head, _, rest = error.param.partition(".")
            error.param = ".".join(filter(None, [RESPONSES_NAMES.get(head, head), rest]))
        raise
    items = Items(body, state.config.model_name)
    if body.stream:
        return StreamingResponse(events(state, handles, items, prompt_tokens), media_type="text/event-stream", headers=STREAM_HEADERS)
    await finish_all(state, handles, items.id)
    (choice, _, _) = handles[0]
    whole = {"delta": {"reasoning_content": choice.reasoning, "content": choice.text,
                       "tool_calls": [call.to_openai() for call in choice.tool_calls]},
             "logprobs": {"content": choice.logprobs}}
    items.feed(whole)
    counted = usage(prompt_tokens, choice, reasoning_tokens(state, choice))
    items.finish(choice.finish_reason, counted)
    return JSONResponse(items.response("incomplete" if choice.finish_reason == "length" else "completed", counted))


@router.get("/v1/responses/{response_id}")
async def stored_response(response_id: str):
    raise ApiError(404, f"response '{response_id}' is not stored: this server keeps no responses (send the whole conversation"
                   " in 'input')", param="response_id", code="not_found")


async def events(state, handles, items: Items, prompt_tokens: int):
    (choice, sequence_id, queue) = handles[0]
    ended = False
    try:
        for event in items.start():
            yield event
        while not choice.done:
            for chunk in choice.take(await queue.get(), state, choice.started):
                for event in items.feed(chunk):
                    yield event
        if choice.cancel_engine:
            state.runtime.cancel(sequence_id)
        ended = True
        if choice.failure:
            yield items.failed(choice.failure)
        else:
            for event in items.finish(choice.finish_reason, usage(prompt_tokens, choice, reasoning_tokens(state, choice))):
                yield event
    finally:
        if not ended:  # the client went away
            state.runtime.cancel(sequence_id)
            log.info("%s: the client left the stream; cancelled its sequence (499)", items.id)
        state.metrics.requests.labels("failed" if choice.failure else "completed" if ended else "cancelled").inc()


def reasoning_tokens(state, choice) -> int:
    """The reasoning's share of the output tokens (its text re-tokenized: the parser splits text,
    not tokens)."""
    return min(len(state.tokenizer.encode(choice.reasoning)), choice.tokens) if choice.reasoning else 0
