"""One choice of one request: tokens in, OpenAI choice objects out (streamed chunks and the final
object), with stop strings, reasoning and tool-call parsing, logprobs and latency metrics."""
from __future__ import annotations

import time

from trellisforge import Sampling, TokenEvent
from trellisforge.tokenizer import StopMatcher

from .glm_output import Delta, OutputParser
from .runtime import Ended


def sampling_for(body, max_tokens: int, index: int, constrained: bool = False) -> Sampling:
    if hasattr(body, "messages"):
        top_logprobs = (body.top_logprobs or 0) if body.logprobs else 0
    else:
        top_logprobs = body.logprobs or 0
    seed = None if body.seed is None else (body.seed + index) % 2 ** 64  # n > 1: distinct draws
    return Sampling(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                    min_p=body.min_p, presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
                    repetition_penalty=body.repetition_penalty, top_logprobs=top_logprobs, seed=seed, constrained=constrained,
                    logit_bias=body.logit_bias_pairs())


class ChoiceState:
    def __init__(self, index: int, plan, tokenizer, stops: list[str], eos_ids: list[int], want_logprobs: bool):
        """`plan`: the request's serving.Plan (kind, reasoning, tools, hidden tokens)."""
        self.index = index
        self.kind = plan.kind
        self.tokenizer = tokenizer
        self.eos_ids = set(eos_ids)
        self.hidden_ids = plan.hidden_ids
        self.detokenizer = tokenizer.detokenizer()
        self.stops = StopMatcher(stops or [])
        self.parser = OutputParser(plan.starts_in_reasoning, plan.tools) if plan.kind == "chat" else None
        self.one_call = plan.one_call
        self.want_logprobs = want_logprobs
        self.tokens = 0
        self.text = ""
        self.reasoning = ""
        self.tool_calls = []
        self.logprobs: list[dict] = []
        self.finish_reason: str | None = None
        self.failure: str | None = None
        self.done = False
        self.cancel_engine = False  # ended here (stop string) while the engine would go on
        self._last_token_at: float | None = None
        self.started = time.monotonic()  # for the time to the first token
        self.cached_tokens = 0  # its prompt's tokens the engine took from the prefix cache

    def role_chunk(self) -> dict:
        return {"index": self.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}

    def take(self, item, state, started: float) -> list[dict]:
        """Consumes one event; returns the chunk choices to stream (possibly none)."""
        if self.done:
            return []
        if isinstance(item, Ended):
            self.done = True
            if item.reason == "shutdown":
                self.finish_reason = "stop"
                return self._chunks(self._finish_text(""), [])
            self.failure = item.reason
            return []
        return self._token(item, state, started)

    def _token(self, event: TokenEvent, state, started: float) -> list[dict]:
        now = time.monotonic()
        metrics = state.metrics
        metrics.generation_tokens.inc()
        if self._last_token_at is None:
            metrics.time_to_first_token.observe(now - started)
        else:
            metrics.inter_token_latency.observe(now - self._last_token_at)
        self._last_token_at = now
        self.tokens += 1
        self.cached_tokens = event.cached_tokens
        logprobs = [self._logprob_entry(event)] if self.want_logprobs else []
        ends_on_eos = event.finish_reason == "stop" and event.token in self.eos_ids
        raw = "" if ends_on_eos or event.token in self.hidden_ids else self.detokenizer.add(event.token)
        if event.finish_reason is not None:
            raw += self.detokenizer.flush()
        emitted, stopped = self.stops.feed(raw)
        if stopped:
            self.finish_reason = "stop"
            self.cancel_engine = event.finish_reason is None
        elif event.finish_reason is not None:
            emitted += self.stops.flush()
            self.finish_reason = "stop" if event.finish_reason in ("stop", "cancelled") else event.finish_reason
        self.logprobs.extend(logprobs)
        if self.finish_reason is None:
            delta = self._feed_text(emitted)
            if not (self.one_call and delta.tool_calls):
                return self._chunks(delta, logprobs)
            # parallel_tool_calls false: the first call ends the choice (the engine's sequence too).
            delta.tool_calls = delta.tool_calls[:1]
            self.finish_reason, self.cancel_engine = "tool_calls", True
        else:
            delta = self._finish_text(emitted)
        self.done = True
        chunks = self._chunks(delta, logprobs)
        metrics.finish_reasons.labels(self.finish_reason).inc()  # after tool calls made it "tool_calls"
        return chunks

    def _feed_text(self, text: str) -> Delta:
        if self.parser is None:
            return Delta(content=text)
        return self.parser.feed(text)

    def _finish_text(self, text: str) -> Delta:
        delta = self._feed_text(text)
        if self.parser is not None:
            rest = self.parser.finish()
            delta.reasoning += rest.reasoning
            delta.content += rest.content
            delta.tool_calls += rest.tool_calls
        if self.parser is not None and self.parser.tool_calls and self.finish_reason == "stop":
            self.finish_reason = "tool_calls"
        return delta

    def _chunks(self, delta: Delta, logprobs: list[dict]) -> list[dict]:
        self.text += delta.content
        self.reasoning += delta.reasoning
        first_call = len(self.tool_calls)
        self.tool_calls += delta.tool_calls
        if not delta and not logprobs and self.finish_reason is None:
            return []
        if self.kind == "chat":
            payload: dict = {}
            if delta.reasoning:
                payload["reasoning_content"] = delta.reasoning
            if delta.content:
                payload["content"] = delta.content
            if delta.tool_calls:
                payload["tool_calls"] = [c.to_openai(first_call + i) for i, c in enumerate(delta.tool_calls)]
            return [{"index": self.index, "delta": payload,
                     "logprobs": {"content": logprobs} if logprobs else None, "finish_reason": self.finish_reason}]
        return [{"index": self.index, "text": delta.content,
                 "logprobs": self._legacy_logprobs(logprobs) if logprobs else None, "finish_reason": self.finish_reason}]

    def final(self, kind: str) -> dict:
        if kind == "chat":
            # Whitespace around tool calls (GLM writes a newline before them) is no content.
            content = self.text if self.text.strip() or not self.tool_calls else None
            message: dict = {"role": "assistant", "content": content if content is not None or self.tool_calls else ""}
            if self.reasoning:
                message["reasoning_content"] = self.reasoning
            if self.tool_calls:
                message["tool_calls"] = [c.to_openai() for c in self.tool_calls]
            return {"index": self.index, "message": message,
                    "logprobs": {"content": self.logprobs} if self.logprobs else None, "finish_reason": self.finish_reason}
        return {"index": self.index, "text": self.text,
                "logprobs": self._legacy_logprobs(self.logprobs) if self.logprobs else None, "finish_reason": self.finish_reason}

    def _logprob_entry(self, event: TokenEvent) -> dict:
        def describe(token: int, logprob: float) -> dict:
            raw = self.tokenizer.token_bytes(token)
            return {"token": raw.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(raw)}
        entry = describe(event.token, event.logprob)
        entry["top_logprobs"] = [describe(t, lp) for t, lp in event.top]
        return entry

    @staticmethod
    def _legacy_logprobs(entries: list[dict]) -> dict:
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries]}
