"""The OpenAI Responses API (what Codex CLI and the Agents SDK speak): POST /v1/responses runs as the
chat request it translates to (responses_request.py) and answers as response objects and events
(responses_output.py); a response is stored unless `store` is false (response_store.py), so a later
request may continue it by `previous_response_id` or name its items by `item_reference`, and GET /
DELETE /v1/responses/{id} and GET .../input_items read it."""
from __future__ import annotations

import logging
from typing import Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..cancellation import cancel_on_disconnect
from ..errors import ApiError
from ..request_body import JsonRoute
from ..responses_output import Items, usage
from ..responses_request import RESPONSES_NAMES, ResponsesRequest, as_chat, input_items
from ..serving import STREAM_HEADERS, finish_all, one_choice_events, start
from .chat import chat_plan

router = APIRouter(route_class=JsonRoute)
log = logging.getLogger("trellisforge")


@router.post("/v1/responses")
@cancel_on_disconnect
async def responses(body: ResponsesRequest, request: Request):
    state = request.app.state.trellisforge
    state.require_ready(body.model)
    own = state.responses.resolve(input_items(body))
    history = state.responses.continued(body.previous_response_id) if body.previous_response_id else []
    try:
        chat = as_chat(body.model_copy(update={"input": history + own}))
        plan = await chat_plan(state, chat)
        handles, prompt_tokens = await start(state, chat, plan)
    except ApiError as error:  # the chat request's names for the Responses request's fields
        if error.param:
            error.param = responses_param(error.param, len(history))
        raise
    store = body.store is not False and state.responses.capacity > 0
    items = Items(body, state.config.model_name, store)
    if body.stream:
        return StreamingResponse(one_choice_events(state, handles[0], items.id, _Streamed(state, items, prompt_tokens, own)),
                                 media_type="text/event-stream", headers=STREAM_HEADERS)
    await finish_all(state, handles, items.id)
    (choice, _, _) = handles[0]
    items.feed({"delta": {"reasoning_content": choice.reasoning, "content": choice.text,
                          "tool_calls": [call.to_openai() for call in choice.tool_calls]},
                "logprobs": {"content": choice.logprobs}})
    items.finish(choice.finish_reason, usage(prompt_tokens, choice, reasoning_tokens(state, choice)))
    keep(state, items, own)
    return JSONResponse(items.final)


def responses_param(param: str, earlier: int) -> str:
    """A chat request's field as the Responses request names it; `input.N` counts the request's own
    items, after the `earlier` ones of the stored conversation it continues."""
    head, _, rest = param.partition(".")
    index, _, tail = rest.partition(".")
    if head == "input" and earlier and index.isdigit():
        if int(index) < earlier:
            return "previous_response_id"
        rest = ".".join(filter(None, [str(int(index) - earlier), tail]))
    return ".".join(filter(None, [RESPONSES_NAMES.get(head, head), rest]))


def keep(state, items: Items, own: list[dict]) -> None:
    if items.store and items.final["status"] in ("completed", "incomplete"):
        if not state.responses.put(items.final, own, items.body.previous_response_id):
            log.info("%s: larger than --responses-store-mb; not stored", items.id)


@router.get("/v1/responses/{response_id}")
async def stored_response(response_id: str, request: Request):
    response = request.app.state.trellisforge.responses.get(response_id)
    if response is None:
        raise not_stored(response_id)
    return JSONResponse(response)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request):
    if not request.app.state.trellisforge.responses.delete(response_id):
        raise not_stored(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


@router.get("/v1/responses/{response_id}/input_items")
async def listed_input_items(response_id: str, request: Request, order: Literal["asc", "desc"] = "desc",
                             limit: int = Query(20, ge=1, le=100), after: str | None = None):
    items = request.app.state.trellisforge.responses.input_items(response_id)
    if items is None:
        raise not_stored(response_id)
    if order == "desc":
        items = items[::-1]
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise ApiError(400, f"after: item '{after}' is not among this response's input items", param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return JSONResponse({"object": "list", "data": page, "first_id": page[0].get("id") if page else None,
                         "last_id": page[-1].get("id") if page else None, "has_more": len(items) > limit})


def not_stored(response_id: str) -> ApiError:
    return ApiError(404, f"response '{response_id}' is not stored here (store was false, it was deleted or evicted, or the"
                    " server restarted)", param="response_id", code="not_found")


class _Streamed:
    """The Items of one streamed response, as serving.one_choice_events drives them; kept once done."""

    def __init__(self, state, items: Items, prompt_tokens: int, own: list[dict]):
        self.state, self.items, self.prompt_tokens, self.own = state, items, prompt_tokens, own
        self.start, self.feed, self.failed = items.start, items.feed, items.failed

    def finish(self, choice) -> list[str]:
        events = self.items.finish(choice.finish_reason, usage(self.prompt_tokens, choice, reasoning_tokens(self.state, choice)))
        keep(self.state, self.items, self.own)
        return events


def reasoning_tokens(state, choice) -> int:
    """The reasoning's share of the output tokens (its text re-tokenized: the parser splits text,
    not tokens)."""
    return min(len(state.tokenizer.encode(choice.reasoning)), choice.tokens) if choice.reasoning else 0
