"""What a Messages API request gets back: the message, its content blocks (a thinking block with
the model's reasoning, a text block with the answer, a tool_use block per tool call, in the order
the model wrote them), its stop_reason and usage; streamed, the events that build it
(message_start, content_block_start / _delta / _stop per block, message_delta, message_stop). Both
come from one `Blocks` fed with the chat choice's deltas, so a stream ends on the message a plain
request returns."""
from __future__ import annotations

import json
import uuid

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class Blocks:
    """The message's content blocks and the events that made them, fed with a chat choice's deltas
    (generation.ChoiceState chunks) in order."""

    def __init__(self, model_name: str, input_tokens: int, cached_tokens: int = 0):
        self.id = new_id("msg")
        self.model = model_name
        self.input_tokens = input_tokens
        self.cached_tokens = cached_tokens
        self.content: list[dict] = []
        self.open: dict | None = None  # the thinking or text block still taking text
        self.space = ""  # whitespace before any answer text: dropped if a tool call comes first

    @staticmethod
    def event(kind: str, **fields) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"

    def message(self, stop_reason: str | None = None, stop_sequence: str | None = None, output_tokens: int = 0) -> dict:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [dict(b) for b in self.content],
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": self.usage(output_tokens)}

    def usage(self, output_tokens: int) -> dict:
        # Anthropic counts cached prompt tokens apart from input_tokens; the prefix cache writes no
        # tokens a client pays for.
        return {"input_tokens": self.input_tokens - self.cached_tokens, "cache_read_input_tokens": self.cached_tokens,
                "cache_creation_input_tokens": 0, "output_tokens": output_tokens}

    def start(self) -> list[str]:
        return [self.event("message_start", message=self.message()), self.event("ping")]

    def feed(self, chunk: dict) -> list[str]:
        """One chat chunk choice ({"delta": {reasoning_content, content, tool_calls}})."""
        delta = chunk.get("delta") or {}
        events = []
        if delta.get("reasoning_content"):
            events += self._grow("thinking", delta["reasoning_content"])
        if delta.get("content"):
            events += self._text(delta["content"])
        for call in delta.get("tool_calls") or []:
            events += self._tool_use(call)
        return events

    def finish(self, finish_reason: str | None, stop_sequence: str | None, output_tokens: int) -> list[str]:
        events = self._close()
        stop_reason = "stop_sequence" if stop_sequence is not None else STOP_REASONS.get(finish_reason, "end_turn")
        self.final = self.message(stop_reason, stop_sequence, output_tokens)
        return events + [self.event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                    usage=self.usage(output_tokens)),
                         self.event("message_stop")]

    @staticmethod
    def failed(message: str) -> str:
        return Blocks.event("error", error={"type": "api_error", "message": message})

    def _text(self, text: str) -> list[str]:
        if self.open is None or self.open["type"] != "text":
            if not (self.space + text).strip():
                self.space += text
                return []
            text, self.space = self.space + text, ""
        return self._grow("text", text)

    def _grow(self, kind: str, text: str) -> list[str]:
        events = []
        if self.open is None or self.open["type"] != kind:
            events += self._close()
            block = {"type": kind, kind: ""} | ({"signature": ""} if kind == "thinking" else {})
            events += self._add(block)
        self.open[kind] += text
        delta = {"type": f"{kind}_delta", kind: text}
        return events + [self.event("content_block_delta", index=len(self.content) - 1, delta=delta)]

    def _tool_use(self, call: dict) -> list[str]:
        """A whole call (the parser gives calls whole): its block starts with an empty input, as
        Anthropic's do, and its one input_json_delta carries the arguments."""
        self.space = ""  # GLM's newline before a tool call is no answer
        arguments = call["function"]["arguments"]  # the parser's arguments, a JSON object
        block = {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": call["function"]["name"],
                 "input": json.loads(arguments)}
        events = self._close()
        self.content.append(block)
        index = len(self.content) - 1
        return events + [self.event("content_block_start", index=index, content_block={**block, "input": {}}),
                         self.event("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": arguments}),
                         self.event("content_block_stop", index=index)]

    def _add(self, block: dict) -> list[str]:
        self.content.append(block)
        self.open = block
        return [self.event("content_block_start", index=len(self.content) - 1, content_block=dict(block))]

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [self.event("content_block_stop", index=len(self.content) - 1)]
