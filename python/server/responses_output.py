"""What a Responses API request gets back: the response object, its output items (a reasoning item
with the model's reasoning as its content, a message with the answer's text, a function_call per
tool call, in the order the model wrote them) and its usage; streamed, the events that build those
items one by one (output_item.added, content_part.added, the text and argument deltas, the .done
events) between response.created and response.completed, each with its sequence_number. Both are
built by one `Items` from the chat choice's deltas, so a streamed response ends on the object a
plain request returns."""
from __future__ import annotations

import json
import time
import uuid


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class Items:
    """The response's output items and the events that made them, fed with a chat choice's deltas
    (generation.ChoiceState chunks) in order."""

    def __init__(self, body, model_name: str, store: bool):
        """`body`: the ResponsesRequest, echoed in the response object as OpenAI does; `store`:
        whether the response will be kept (its `store` field)."""
        self.body = body
        self.store = store
        self.final: dict | None = None  # the response object finish() or failed() ended on
        self.id = new_id("resp")
        self.model = model_name
        self.created_at = int(time.time())
        self.output: list[dict] = []
        self.sequence = 0
        self.open: dict | None = None  # the reasoning or message item still taking text
        self.text = ""  # its text so far
        self.logprobs: list[dict] = []
        self.space = ""  # whitespace before any message text: dropped if a tool call comes first

    def event(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def response(self, status: str, usage: dict | None = None, error: dict | None = None) -> dict:
        b = self.body
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        effort = b.reasoning.effort if b.reasoning is not None else None
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status, "model": self.model,
            "output": [dict(item) for item in self.output], "error": error, "incomplete_details": incomplete,
            "instructions": b.instructions, "max_output_tokens": b.max_output_tokens, "metadata": b.metadata or {},
            "parallel_tool_calls": b.parallel_tool_calls is not False, "previous_response_id": b.previous_response_id,
            "reasoning": {"effort": effort, "summary": None} if b.reasoning is not None else None, "store": self.store,
            "temperature": b.temperature, "top_p": b.top_p, "tool_choice": b.tool_choice or "auto", "tools": b.tools or [],
            "text": {"format": (b.text.format if b.text is not None and b.text.format else {"type": "text"})},
            "truncation": "disabled", "usage": usage, "user": b.user,
            **({"completed_at": int(time.time())} if status in ("completed", "incomplete") else {}),
        }

    def start(self) -> list[str]:
        return [self.event("response.created", response=self.response("in_progress")),
                self.event("response.in_progress", response=self.response("in_progress"))]

    def feed(self, chunk: dict) -> list[str]:
        """One chat chunk choice ({"delta": {reasoning_content, content, tool_calls}, "logprobs"})."""
        delta = chunk.get("delta") or {}
        logprobs = (chunk.get("logprobs") or {}).get("content") or []
        events = []
        if delta.get("reasoning_content"):
            events += self._reasoning(delta["reasoning_content"])
        if delta.get("content") or logprobs:
            events += self._text(delta.get("content") or "", logprobs)
        for call in delta.get("tool_calls") or []:
            events += self._call(call)
        return events

    def finish(self, finish_reason: str | None, usage: dict) -> list[str]:
        status = "incomplete" if finish_reason == "length" else "completed"
        events = self._close(status) if self.open is not None and self.open["type"] != "message" else []
        if self.open is None and not any(item["type"] in ("message", "function_call") for item in self.output):
            events += self._open_message()  # an answer with no text still has its (empty) message
        events += self._close(status)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        self.final = self.response(status, usage)
        return events + [self.event(kind, response=self.final)]

    def failed(self, message: str) -> str:
        self.final = self.response("failed", error={"code": "server_error", "message": message})
        return self.event("response.failed", response=self.final)

    def _reasoning(self, text: str) -> list[str]:
        events = []
        if self.open is None or self.open["type"] != "reasoning":
            events += self._close("completed")
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
            events += self._add(item, {"type": "reasoning_text", "text": ""})
        self.text += text
        return events + [self.event("response.reasoning_text.delta", item_id=self.open["id"], output_index=len(self.output) - 1,
                                    content_index=0, delta=text)]

    def _text(self, text: str, logprobs: list[dict]) -> list[str]:
        if self.open is None or self.open["type"] != "message":
            if not (self.space + text).strip() and not logprobs:
                self.space += text
                return []
            events = self._close("completed") + self._open_message()
            text, self.space = self.space + text, ""
        else:
            events = []
        self.text += text
        self.logprobs += logprobs
        return events + [self.event("response.output_text.delta", item_id=self.open["id"], output_index=len(self.output) - 1,
                                    content_index=0, delta=text, logprobs=[delta_logprob(e) for e in logprobs])]

    def _open_message(self) -> list[str]:
        item = {"id": new_id("msg"), "type": "message", "role": "assistant", "content": [], "status": "in_progress"}
        return self._add(item, {"type": "output_text", "text": "", "annotations": [], "logprobs": []})

    def _call(self, call: dict) -> list[str]:
        self.space = ""  # GLM's newline before a tool call is no answer
        events = self._close("completed")
        arguments = call["function"]["arguments"]
        item = {"id": new_id("fc"), "type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                "arguments": "", "status": "in_progress"}
        self.output.append(item)
        index = len(self.output) - 1
        events.append(self.event("response.output_item.added", output_index=index, item=dict(item)))
        events.append(self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=arguments))
        item |= {"arguments": arguments, "status": "completed"}
        events.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                 arguments=arguments, name=item["name"]))
        return events + [self.event("response.output_item.done", output_index=index, item=dict(item))]

    def _add(self, item: dict, part: dict) -> list[str]:
        self.output.append(item)
        self.open, self.text, self.logprobs = item, "", []
        index = len(self.output) - 1
        return [self.event("response.output_item.added", output_index=index, item=dict(item)),
                self.event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part)]

    def _close(self, status: str) -> list[str]:
        item = self.open
        if item is None:
            return []
        self.open = None
        index = self.output.index(item)
        if item["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": self.text}
            done = self.event("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0, text=self.text)
        else:
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": self.logprobs}
            done = self.event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=self.text,
                              logprobs=[delta_logprob(e) for e in self.logprobs])
        item |= {"content": [part], "status": status}
        return [done, self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part),
                self.event("response.output_item.done", output_index=index, item=dict(item))]


def delta_logprob(entry: dict) -> dict:
    """A chat logprob entry in the text events' shape (no bytes)."""
    return {"token": entry["token"], "logprob": entry["logprob"],
            "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in entry.get("top_logprobs", [])]}


def usage(prompt_tokens: int, choice, reasoning_tokens: int) -> dict:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": choice.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": choice.tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt_tokens + choice.tokens}
