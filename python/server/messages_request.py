"""Anthropic's Messages API request (POST /v1/messages: what Claude Code and the Anthropic SDKs
send), as this server takes it, turned into the chat request it runs as: `system` becomes the system
message; a user turn's tool_result blocks become tool messages (before its text), an assistant
turn's thinking blocks its reasoning_content and its tool_use blocks tool calls; tools (with their
`input_schema`) become function tools, `tool_choice` any/tool/none the chat's required/named/none,
`thinking` disabled the template's enable_thinking false, `stop_sequences` the stop strings.
Images and documents are refused (the text model runs here), and so are tools that run on
Anthropic's side (web search, code execution, ...): nothing here runs them."""
from __future__ import annotations

import json
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ApiError
from .schemas import ChatCompletionRequest

MEDIA_BLOCKS = ("image", "document", "search_result", "container_upload")


class Thinking(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1)


class MessagesRequest(BaseModel):
    # Fields Anthropic adds (context_management, service_tier, ...) are taken and ignored: Claude
    # Code sends new ones between releases, and none of them changes what a text model writes.
    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: Union[str, list[dict[str, Any]], None] = None
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: Thinking | None = None
    metadata: dict[str, Any] | None = None
    # Refused with a reason when set: they need tools run on the server's side.
    mcp_servers: list[dict[str, Any]] | None = None
    container: Union[str, dict[str, Any], None] = None


class CountTokensRequest(MessagesRequest):
    """POST /v1/messages/count_tokens: a request as it would be sent, max_tokens not needed."""
    max_tokens: int | None = Field(default=None, ge=1)


def as_chat(body: MessagesRequest) -> ChatCompletionRequest:
    """The chat request that runs `body` (raises ApiError naming the Messages field at fault)."""
    for name in ("mcp_servers", "container"):
        if getattr(body, name):
            raise ApiError(400, f"{name}: servers and containers run on Anthropic's side; this server runs the model alone",
                           param=name, code="unsupported_parameter")
    chat: dict[str, Any] = {
        "model": body.model, "messages": messages(body), "stream": body.stream, "max_completion_tokens": body.max_tokens,
        "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k, "stop": body.stop_sequences or None,
    }
    if body.tools:
        chat["tools"] = [function_tool(tool, i) for i, tool in enumerate(body.tools)]
    if body.tool_choice is not None:
        chat["tool_choice"], parallel = tool_choice(body.tool_choice)
        if parallel is False:
            chat["parallel_tool_calls"] = False
    if (body.model_extra or {}).get("ignore_eos") is True:  # vLLM's extension, as the chat route takes it
        chat["ignore_eos"] = True
    if body.thinking is not None and body.thinking.type == "disabled":
        chat["chat_template_kwargs"] = {"enable_thinking": False}
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as error:
        first = error.errors()[0]
        path = [str(p) for p in first.get("loc", ())]
        where = ".".join([MESSAGES_NAMES.get(path[0], path[0])] + path[1:]) if path else None
        raise ApiError(400, f"{where}: {first.get('msg', 'invalid value')}", param=where, code="invalid_value") from None


MESSAGES_NAMES = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences"}


def messages(body: MessagesRequest) -> list[dict]:
    out: list[dict] = []
    if body.system:
        out.append({"role": "system", "content": text_of(body.system, "system")})
    for i, message in enumerate(body.messages):
        where = f"messages.{i}"
        role = message.get("role")
        content = message.get("content")
        if role not in ("user", "assistant"):
            raise ApiError(400, f"{where}.role: user or assistant, not {role!r}", param=f"{where}.role")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise ApiError(400, f"{where}.content: a string or a list of content blocks", param=f"{where}.content")
        if role == "user":
            out += user_turn(blocks, f"{where}.content")
        else:
            out.append(assistant_turn(blocks, f"{where}.content"))
    return out


def user_turn(blocks: list, where: str) -> list[dict]:
    """Tool results first, as tool messages (Anthropic puts them first in the turn), then the text."""
    results, text = [], []
    for j, block in enumerate(blocks):
        kind = kind_of(block, f"{where}.{j}")
        if kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise ApiError(400, f"{where}.{j}.tool_use_id: a tool_result block needs its tool_use_id", param=f"{where}.{j}.tool_use_id")
            output = text_of(block.get("content") or "", f"{where}.{j}.content")
            if block.get("is_error"):
                output = f"Error: {output}"
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": output})
        elif kind == "text":
            text.append(block_text(block, f"{where}.{j}"))
        else:
            raise unsupported(kind, f"{where}.{j}", "text, tool_result")
    return results + ([{"role": "user", "content": "".join(text)}] if text or not results else [])


def assistant_turn(blocks: list, where: str) -> dict:
    turn: dict = {"role": "assistant", "content": ""}
    for j, block in enumerate(blocks):
        kind = kind_of(block, f"{where}.{j}")
        if kind == "text":
            turn["content"] += block_text(block, f"{where}.{j}")
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise ApiError(400, f"{where}.{j}.thinking: a thinking block needs its text", param=f"{where}.{j}.thinking")
            turn["reasoning_content"] = turn.get("reasoning_content", "") + block["thinking"]
        elif kind == "redacted_thinking":
            continue  # Anthropic's encrypted reasoning: nothing a GLM template can show
        elif kind == "tool_use":
            for key in ("id", "name"):
                if not isinstance(block.get(key), str):
                    raise ApiError(400, f"{where}.{j}.{key}: a tool_use block needs '{key}'", param=f"{where}.{j}.{key}")
            if not isinstance(block.get("input", {}), dict):
                raise ApiError(400, f"{where}.{j}.input: an object", param=f"{where}.{j}.input")
            turn.setdefault("tool_calls", []).append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}})
        else:
            raise unsupported(kind, f"{where}.{j}", "text, thinking, redacted_thinking, tool_use")
    return turn


def kind_of(block, where: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind in MEDIA_BLOCKS:
        raise ApiError(400, f"{where}: {kind} content is not supported: this server runs the text model", param=where,
                       code="unsupported_content")
    if not isinstance(kind, str):
        raise ApiError(400, f"{where}: a content block with a 'type'", param=where)
    return kind


def unsupported(kind: str, where: str, allowed: str) -> ApiError:
    return ApiError(400, f"{where}.type: {kind!r} blocks are not taken here ({allowed} are)", param=f"{where}.type",
                    code="unsupported_value")


def block_text(block: dict, where: str) -> str:
    if not isinstance(block.get("text"), str):
        raise ApiError(400, f"{where}.text: a text block needs 'text' as a string", param=f"{where}.text")
    return block["text"]


def text_of(content, where: str) -> str:
    """A string, or text blocks joined (a system prompt or a tool result; cache_control is taken
    and needs nothing: the prefix cache keys on the tokens)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}: a string or a list of text blocks", param=where)
    parts = []
    for j, block in enumerate(content):
        kind = kind_of(block, f"{where}.{j}")
        if kind != "text":
            raise unsupported(kind, f"{where}.{j}", "text")
        parts.append(block_text(block, f"{where}.{j}"))
    return "\n".join(parts)


def function_tool(tool: dict, i: int) -> dict:
    where = f"tools.{i}"
    if tool.get("type") not in (None, "custom"):
        raise ApiError(400, f"{where}.type: {tool.get('type')!r} tools run on Anthropic's side; only tools the client runs"
                       " (a name and an input_schema) are taken here", param=f"{where}.type", code="unsupported_value")
    if not isinstance(tool.get("name"), str) or not isinstance(tool.get("input_schema"), dict):
        raise ApiError(400, f"{where}: a tool has a 'name' and an 'input_schema' object", param=where)
    function = {"name": tool["name"], "parameters": tool["input_schema"]}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def tool_choice(choice: dict) -> tuple[str | dict, bool | None]:
    """The chat's tool_choice, and False where the client turned parallel tool use off."""
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise ApiError(400, "tool_choice: {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}", param="tool_choice",
                   code="unsupported_value")
