"""GLM's generated text split into reasoning, content and tool calls (GLM.md §5.3), streaming.

Reasoning is the text inside <think>...</think>. When the generation prompt already opened the
block (GLM-4.7 and later render `<|assistant|><think>`), the output starts inside it. Tool calls
are `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>`, with or without
the newlines GLM-4.5/4.6 put between the parts; values that parse as JSON are JSON, the rest are
strings (the template writes strings raw), except where the function's schema says a parameter is a
string: then the value is the text as written, even when it looks like a number."""
from __future__ import annotations

import dataclasses
import json
import re
import uuid

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
CALL_TAGS = (CALL_OPEN, CALL_CLOSE, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


@dataclasses.dataclass
class ToolCall:
    name: str
    arguments: dict
    id: str = dataclasses.field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function",
               "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}
        if index is not None:
            out["index"] = index
        return out


def parse_tool_call(block: str, string_parameters: dict[str, set[str]] | None = None) -> ToolCall | None:
    """The inside of one <tool_call>...</tool_call>; None when it has no name. string_parameters:
    per function name, the parameters its schema types as plain strings."""
    head = block.split("<arg_key>", 1)[0].strip()
    if not head:
        return None
    raw_keys = (string_parameters or {}).get(head, set())
    arguments = {}
    for key, value in _ARGUMENT.findall(block):
        key, value = key.strip(), value.strip("\n")
        if key in raw_keys:
            arguments[key] = value
            continue
        try:
            arguments[key] = json.loads(value)
        except ValueError:
            arguments[key] = value
    return ToolCall(name=head, arguments=arguments)


def string_parameters(tools: list[dict] | None) -> dict[str, set[str]]:
    """Per function, the parameters typed as plain strings by its schema."""
    out = {}
    for tool in tools or []:
        function = tool.get("function") or {}
        properties = (function.get("parameters") or {}).get("properties") or {}
        out[function.get("name")] = {k for k, v in properties.items() if isinstance(v, dict) and v.get("type") == "string"}
    return out


@dataclasses.dataclass
class Delta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


class OutputParser:
    """Feed text deltas; get reasoning, content and complete tool calls back. Text that might be
    the start of a tag is held until the next delta decides it."""

    def __init__(self, starts_in_reasoning: bool, tools: list[dict] | None):
        """tools: the request's tools (calls are parsed only when there are some)."""
        self.in_reasoning = starts_in_reasoning
        self.parse_tools = tools is not None
        self._string_parameters = string_parameters(tools)
        self._pending = ""
        self._call: str | None = None  # text inside an open <tool_call>
        self.tool_calls: list[ToolCall] = []

    def feed(self, text: str) -> Delta:
        self._pending += text
        delta = Delta()
        while self._pending:
            if not self._step(delta):
                break
        return delta

    def finish(self) -> Delta:
        """End of generation: what is held becomes text (an unclosed tool call stays content)."""
        delta = Delta()
        rest = self._pending
        if self._call is not None:
            rest = CALL_OPEN + self._call + rest
            self._call = None
        self._pending = ""
        if rest:
            if self.in_reasoning:
                delta.reasoning += rest
            else:
                delta.content += rest
        return delta

    def _step(self, delta: Delta) -> bool:
        text = self._pending
        if self._call is not None:
            end = text.find(CALL_CLOSE)
            if end < 0:
                keep = _partial_suffix(text, CALL_CLOSE)
                self._call += text[: len(text) - keep]
                self._pending = text[len(text) - keep:]
                return False
            self._call += text[:end]
            call = parse_tool_call(self._call, self._string_parameters)
            if call is not None:
                self.tool_calls.append(call)
                delta.tool_calls.append(call)
            else:
                delta.content += CALL_OPEN + self._call + CALL_CLOSE
            self._call = None
            self._pending = text[end + len(CALL_CLOSE):]
            return True
        tags = [THINK_CLOSE] if self.in_reasoning else [THINK_OPEN] + ([CALL_OPEN] if self.parse_tools else [])
        hits = [(text.find(tag), tag) for tag in tags if tag in text]
        if not hits:
            keep = max(_partial_suffix(text, tag) for tag in tags)
            self._emit(delta, text[: len(text) - keep])
            self._pending = text[len(text) - keep:]
            return False
        at, tag = min(hits)
        self._emit(delta, text[:at])
        self._pending = text[at + len(tag):]
        if tag == THINK_OPEN:
            self.in_reasoning = True
        elif tag == THINK_CLOSE:
            self.in_reasoning = False
        else:
            self._call = ""
        return True

    def _emit(self, delta: Delta, text: str) -> None:
        if self.in_reasoning:
            delta.reasoning += text
        else:
            delta.content += text


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0
