"""The OpenAI Responses API's request (POST /v1/responses), as this server takes it, turned into the
chat request it runs as: `instructions` and the `input` items become chat messages (a reasoning
item becomes the next assistant turn's reasoning_content, function calls and their outputs become
tool calls and tool messages), function tools become chat tools, `text.format` the response_format,
`reasoning.effort` the reasoning_effort. `previous_response_id` and item references are resolved
from the stored responses (response_store.py) before; tools other than functions and input that is
not text are refused."""
from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import Field, ValidationError

from .errors import ApiError
from .responses_output import new_id
from .schemas import ChatCompletionRequest, Strict, StreamOptions

TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
MEDIA_PARTS = ("input_image", "input_file", "input_audio")


class Reasoning(Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None  # the reasoning comes whole, as its content
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class TextConfig(Strict):
    format: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint for OpenAI's models; GLM's templates take none


class ResponsesRequest(Strict):
    model: str
    input: Union[str, list[dict[str, Any]]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], dict[str, Any], None] = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    include: list[str] | None = None
    truncation: Literal["disabled"] | None = None
    store: bool | None = None  # default true, as OpenAI's
    previous_response_id: str | None = None
    # Accepted, and cannot change the output here: no built-in tool runs.
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    max_tool_calls: int | None = Field(default=None, ge=1)
    # Refused with a reason when set.
    background: bool | None = None
    conversation: Union[str, dict[str, Any], None] = None
    # Beyond OpenAI's, as vLLM names them.
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    seed: int | None = Field(default=None, ge=-(2 ** 63), lt=2 ** 64)
    chat_template_kwargs: dict[str, Any] | None = None


def as_chat(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that runs `body` (raises ApiError naming the Responses field at fault)."""
    if body.conversation is not None:
        raise ApiError(400, "conversation: conversations are not kept here: send 'previous_response_id' or the whole"
                       " conversation in 'input'", param="conversation", code="unsupported_parameter")
    if body.background:
        raise ApiError(400, "background: responses run while the request is open here", param="background",
                       code="unsupported_parameter")
    chat: dict[str, Any] = {
        "model": body.model, "messages": messages(body), "stream": body.stream, "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k, "min_p": body.min_p,
        "repetition_penalty": body.repetition_penalty, "seed": body.seed, "chat_template_kwargs": body.chat_template_kwargs,
        "parallel_tool_calls": body.parallel_tool_calls,
    }
    if body.top_logprobs:
        chat |= {"logprobs": True, "top_logprobs": body.top_logprobs}
    elif "message.output_text.logprobs" in (body.include or []):
        chat["logprobs"] = True
    if body.tools:
        chat["tools"] = [function_tool(tool, i) for i, tool in enumerate(body.tools)]
    if body.tool_choice is not None:
        chat["tool_choice"] = tool_choice(body.tool_choice)
    if body.text is not None and body.text.format is not None:
        chat["response_format"] = response_format(body.text.format)
    if body.reasoning is not None and body.reasoning.effort is not None:
        chat["reasoning_effort"] = body.reasoning.effort
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as error:  # a field passed through whole: name it by its Responses place
        first = error.errors()[0]
        path = [str(p) for p in first.get("loc", ())]
        if path[:2] == ["response_format", "json_schema"]:  # the Responses format is flat
            path = path[:1] + path[2:]
        where = ".".join([RESPONSES_NAMES.get(path[0], path[0])] + path[1:]) if path else None
        raise ApiError(400, f"{where}: {first.get('msg', 'invalid value')}", param=where, code="invalid_value") from None


RESPONSES_NAMES = {"response_format": "text.format", "reasoning_effort": "reasoning.effort", "messages": "input",
                   "max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens"}


def input_items(body: ResponsesRequest) -> list[dict]:
    """The request's input as items, each with an id (a string input is one user message), as the
    store keeps them and GET /v1/responses/{id}/input_items lists them."""
    if isinstance(body.input, str):
        return [{"id": new_id("msg"), "type": "message", "role": "user", "content": [{"type": "input_text", "text": body.input}]}]
    prefixes = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
    return [item if "id" in item else {"id": new_id(prefixes.get(item.get("type", "message"), "item")), **item}
            for item in body.input]


def messages(body: ResponsesRequest) -> list[dict]:
    out: list[dict] = [{"role": "system", "content": body.instructions}] if body.instructions else []
    if isinstance(body.input, str):
        return out + [{"role": "user", "content": body.input}]
    reasoning: str | None = None  # a reasoning item's text, for the assistant turn after it

    def assistant() -> dict:
        """The assistant turn the next output item belongs to: the last one when it is still open."""
        nonlocal reasoning
        if not out or out[-1]["role"] != "assistant" or reasoning is not None:
            out.append({"role": "assistant", "content": ""})
        if reasoning is not None:
            out[-1]["reasoning_content"] = reasoning
            reasoning = None
        return out[-1]

    for i, item in enumerate(body.input):
        where = f"input.{i}"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ApiError(400, f"{where}.role: one of user, assistant, system, developer, not {role!r}", param=f"{where}.role")
            text = content_text(item.get("content"), f"{where}.content")
            if role == "assistant":
                turn = assistant()
                turn["content"] += text
            else:
                out.append({"role": role, "content": text})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning = (reasoning or "") + content_text(parts, f"{where}.content")
        elif kind == "function_call":
            call = {key: item.get(key) for key in ("call_id", "name", "arguments")}
            for key, value in call.items():
                if not isinstance(value, str):
                    raise ApiError(400, f"{where}.{key}: a function_call item needs '{key}' as a string", param=f"{where}.{key}")
            turn = assistant()
            turn.setdefault("tool_calls", []).append(
                {"id": call["call_id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise ApiError(400, f"{where}.call_id: a function_call_output item needs 'call_id'", param=f"{where}.call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else content_text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        else:
            raise ApiError(400, f"{where}.type: items of type {kind!r} are not supported here (message, reasoning, function_call,"
                           " function_call_output are)", param=f"{where}.type", code="unsupported_value")
    if reasoning is not None:  # reasoning with nothing after it: an assistant turn of its own
        assistant()
    return out


def content_text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}: a string or a list of content parts", param=where)
    text = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in MEDIA_PARTS:
            raise ApiError(400, f"{where}.{j}: {kind} content is not supported: this server runs the text model",
                           param=f"{where}.{j}", code="unsupported_content")
        if kind == "refusal":
            continue
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise ApiError(400, f"{where}.{j}: a text part ({', '.join(TEXT_PARTS)}) with 'text'", param=f"{where}.{j}")
        text.append(part["text"])
    return "".join(text)


def function_tool(tool: dict, i: int) -> dict:
    where = f"tools.{i}"
    if tool.get("type") != "function":
        raise ApiError(400, f"{where}.type: only function tools run here, not {tool.get('type')!r}", param=f"{where}.type",
                       code="unsupported_value")
    known = {"type", "name", "description", "parameters", "strict"}
    extra = sorted(set(tool) - known)
    if extra or not isinstance(tool.get("name"), str):
        raise ApiError(400, f"{where}: a function tool has a 'name' and may have {', '.join(sorted(known - {'type', 'name'}))}"
                       + (f", not {', '.join(extra)}" if extra else ""), param=where)
    return {"type": "function", "function": {key: tool[key] for key in known - {"type"} if tool.get(key) is not None}}


def tool_choice(choice) -> str | dict:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ApiError(400, "tool_choice: none, auto, required or {'type': 'function', 'name': ...}", param="tool_choice",
                   code="unsupported_value")


def response_format(fmt: dict) -> dict:
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        schema = {key: fmt[key] for key in ("name", "description", "strict") if key in fmt}
        schema["schema"] = fmt.get("schema")
        return {"type": "json_schema", "json_schema": schema}
    raise ApiError(400, f"text.format.type: text, json_object or json_schema, not {kind!r}", param="text.format.type")
