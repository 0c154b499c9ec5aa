"""POST /v1/chat/completions: messages through the checkpoint's chat template, then generation with
GLM's reasoning and tool calls split out (glm_output.py), and structured outputs (structured.py)."""
from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Request

from ..cancellation import cancel_on_disconnect
from ..errors import ApiError
from ..glm_output import CALL_TAGS, THINK_CLOSE, THINK_OPEN
from ..request_body import JsonRoute, surrogate_path
from ..schemas import ChatCompletionRequest
from ..serving import Plan, encode, generate

router = APIRouter(route_class=JsonRoute)


@router.post("/v1/chat/completions")
@cancel_on_disconnect
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state = request.app.state.trellisforge
    state.require_ready(body.model)
    return await generate(state, body, await chat_plan(state, body))


async def chat_plan(state, body: ChatCompletionRequest) -> Plan:
    """The request's prompt through the chat template, its output parsers and its grammar (the
    Responses API's route runs its requests through this too)."""
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools and body.tool_choice != "none" else None
    messages = template_messages(body)
    template_kwargs = dict(body.chat_template_kwargs or {})
    if body.reasoning_effort is not None:  # GLM-5.3's templates read it; others ignore it
        template_kwargs.setdefault("reasoning_effort", body.reasoning_effort)
    try:
        prompt_text = await asyncio.to_thread(state.tokenizer.render_chat, messages, tools=tools, add_generation_prompt=True,
                                              **template_kwargs)
    except ValueError as error:  # TemplateError, or a template argument it cannot take
        raise ApiError(400, str(error), param="messages") from None
    except TypeError as error:
        raise ApiError(400, f"chat_template_kwargs: {error}", param="chat_template_kwargs") from None
    prompt = await encode(state, prompt_text, "messages")
    starts_in_reasoning = prompt_text.rstrip().endswith(THINK_OPEN)
    grammar = await asyncio.to_thread(state.grammars.for_request, body, tools, starts_in_reasoning)
    parsed = {THINK_OPEN, THINK_CLOSE} | (set(CALL_TAGS) if tools is not None else set())
    kept = {state.tokenizer.token_id(tag) for tag in parsed} - {None}
    return Plan(kind="chat", prompts=[prompt], max_tokens=body.max_completion_tokens or body.max_tokens,
                starts_in_reasoning=starts_in_reasoning, tools=tools, grammar=grammar,
                one_call=tools is not None and body.parallel_tool_calls is False,
                hidden_ids=state.hidden_ids(kept) if body.skip_special_tokens else frozenset())


def template_messages(body: ChatCompletionRequest) -> list[dict]:
    """OpenAI messages as chat templates expect them: tool results under role "tool" (GLM's
    templates render them as <|observation|>), assistant tool calls with parsed arguments."""
    out = []
    for i, message in enumerate(body.messages):
        media = message.media_part()
        if media is not None:
            where = f"messages.{i}.content.{media}"
            kind = message.content[media].type
            raise ApiError(400, f"{where}: {kind} content is not supported: this server runs the text model", param=where,
                           code="unsupported_content")
        for j, part in enumerate(message.content if isinstance(message.content, list) else []):
            if part.text is None:
                raise ApiError(400, f"messages.{i}.content.{j}: a text part needs 'text'", param=f"messages.{i}.content.{j}.text")
        item: dict = {"role": "system" if message.role == "developer" else message.role, "content": message.text()}
        if message.reasoning_content:
            item["reasoning_content"] = message.reasoning_content
        if message.tool_calls:
            calls = []
            for j, call in enumerate(message.tool_calls):
                where = f"messages.{i}.tool_calls.{j}.function.arguments"
                try:
                    arguments = json.loads(call.function.arguments or "{}")
                except ValueError:
                    raise ApiError(400, f"{where} is not valid JSON", param=where) from None
                if surrogate_path(arguments) is not None:  # escaped inside the arguments' own JSON
                    raise ApiError(400, f"{where} holds a lone UTF-16 surrogate, which is not text", param=where,
                                   code="invalid_unicode")
                calls.append({"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}})
            item["tool_calls"] = calls
        if message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        if message.name:
            item["name"] = message.name
        out.append(item)
    return out
