"""One generation request, chat or completion: its sequences submitted (n choices per prompt, indexed
prompt by prompt), then collected into one response or streamed as server-sent events. Every
sequence still running when the request ends early (its client left, the server stops) is
cancelled, and the request is counted by outcome."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid

from fastapi.responses import JSONResponse, StreamingResponse

from trellisforge import TrellisError
from trellisforge.engine import PAGE_TOKENS

from . import errors
from .errors import ApiError
from .generation import ChoiceState, sampling_for
from .structured import Grammar

log = logging.getLogger("trellisforge")


@dataclasses.dataclass
class Plan:
    kind: str  # "chat" or "text"
    prompts: list[list[int]]
    max_tokens: int | None
    starts_in_reasoning: bool = False
    tools: list[dict] | None = None  # the calls to parse, when the request offers tools
    grammar: Grammar | None = None  # structured output: every choice constrained by it
    hidden_ids: frozenset = frozenset()  # tokens whose text never reaches the client
    one_call: bool = False  # parallel_tool_calls false: a choice ends at its first tool call


async def encode(state, text: str, param: str) -> list[int]:
    """Tokens of a prompt, tokenized in a worker thread (seconds for megabytes of text, while the
    event loop goes on serving); a text that must exceed the context is refused untokenized."""
    context = state.engine.context_tokens_max
    at_least = state.tokenizer.tokens_at_least(text)
    if at_least >= context:
        raise ApiError(400, f"the prompt has at least {at_least} tokens; the context holds {context}", param=param,
                       code="context_length_exceeded")
    return await asyncio.to_thread(state.tokenizer.encode, text)


async def generate(state, body, plan: Plan):
    handles, prompt_tokens = await start(state, body, plan)
    request_id = ("chatcmpl-" if plan.kind == "chat" else "cmpl-") + uuid.uuid4().hex
    header = {"id": request_id, "created": int(time.time()), "model": state.config.model_name}
    if body.stream:
        return StreamingResponse(stream(state, handles, header, body, prompt_tokens, plan.kind), media_type="text/event-stream",
                                 headers=STREAM_HEADERS)
    return await collect(state, handles, header, body, prompt_tokens, plan.kind)


STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def start(state, body, plan: Plan) -> tuple[list, int]:
    """The plan's sequences in the engine, once its prompts and limits are checked: the handles
    (choice, sequence id, event queue) and the prompt tokens counted."""
    context = state.engine.context_tokens_max
    param = "messages" if plan.kind == "chat" else "prompt"
    for prompt in plan.prompts:
        if len(prompt) >= context:
            raise ApiError(400, f"the prompt has {len(prompt)} tokens; the context holds {context}", param=param,
                           code="context_length_exceeded")
    longest = max(len(p) for p in plan.prompts)
    outside = [token for token, _ in body.logit_bias_pairs() if token >= state.engine.vocab_size]
    if outside:
        raise ApiError(400, f"logit_bias: token id {outside[0]} is not below the vocabulary size {state.engine.vocab_size}",
                       param="logit_bias", code="token_out_of_vocabulary")
    if plan.max_tokens is not None and plan.max_tokens > context - longest:
        raise ApiError(400, f"max_tokens {plan.max_tokens} plus the prompt's {longest} tokens exceed the context of {context}",
                       param="max_tokens", code="context_length_exceeded")
    handles = await submit(state, body, plan)
    prompt_tokens = sum(len(p) for p in plan.prompts)
    state.metrics.prompt_tokens.inc(prompt_tokens * body.n)
    return handles, prompt_tokens


async def submit(state, body, plan: Plan) -> list:
    """Every choice's sequence in the engine: (choice, sequence id, event queue) each."""
    want_logprobs = bool(body.logprobs) if plan.kind == "chat" else body.logprobs is not None
    stop_ids = [] if body.ignore_eos and plan.grammar is None else state.engine.eos_token_ids
    handles = []
    try:
        for prompt_index, prompt in enumerate(plan.prompts):
            max_tokens = plan.max_tokens or context_left(state, prompt)
            leader = None
            for j in range(body.n):
                index = prompt_index * body.n + j
                choice = ChoiceState(index, plan, state.tokenizer, body.stop, state.engine.eos_token_ids, want_logprobs)
                constraint = await asyncio.to_thread(state.grammars.constraint, plan.grammar) if plan.grammar else None
                sampling = sampling_for(body, max_tokens, index, constrained=constraint is not None)
                sequence_id, events = await state.runtime.submit(prompt, sampling, stop_ids, constraint, after=leader)
                handles.append((choice, sequence_id, events))
                if j == 0 and body.n > 1 and shares_pages(state, prompt):
                    leader = sequence_id
    except TrellisError as error:
        cancel_all(state, handles)
        status = 503 if "slots are in use" in str(error) else 400
        raise ApiError(status, str(error), code="overloaded" if status == 503 else "invalid_value") from None
    except asyncio.CancelledError:  # the client left while the sequences were being added
        log.info("the client left while its sequences were added; cancelled %d (499)", cancel_all(state, handles))
        state.metrics.requests.labels("cancelled").inc()
        raise
    except BaseException:
        cancel_all(state, handles)
        raise
    return handles


def shares_pages(state, prompt: list[int]) -> bool:
    """Whether an n > 1 request's other choices should wait for the first one's prompt: the prefix
    cache then maps its full pages (a prompt's last token is always computed) instead of every
    choice computing the same prompt in the same steps."""
    return bool(state.runtime.stats.get("prefix_cache")) and len(prompt) > PAGE_TOKENS


def context_left(state, prompt: list[int]) -> int:
    return state.engine.context_tokens_max - len(prompt)


def cancel_all(state, handles) -> int:
    unfinished = [sequence_id for choice, sequence_id, _ in handles if not choice.done]
    for sequence_id in unfinished:
        state.runtime.cancel(sequence_id)
    return len(unfinished)


async def finish_all(state, handles, request_id: str) -> None:
    """Every choice to its end (the request counted as completed), or a 503 when the engine
    failed under one; a client that leaves cancels the unfinished ones."""
    try:
        for choice, sequence_id, events in handles:
            while not choice.done:
                choice.take(await events.get(), state, choice.started)
            if choice.cancel_engine:
                state.runtime.cancel(sequence_id)
    except asyncio.CancelledError:  # cancellation.py: the client left
        log.info("%s: the client left; cancelled %d unfinished sequence(s) (499)", request_id, cancel_all(state, handles))
        state.metrics.requests.labels("cancelled").inc()
        raise
    failure = next((choice.failure for choice, _, _ in handles if choice.failure), None)
    if failure:
        state.metrics.requests.labels("failed").inc()
        raise ApiError(503, failure)
    state.metrics.requests.labels("completed").inc()


async def collect(state, handles, header, body, prompt_tokens: int, kind: str):
    await finish_all(state, handles, header["id"])
    completion_tokens = sum(choice.tokens for choice, _, _ in handles)
    return JSONResponse({
        **header,
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "choices": [choice.final(kind) for choice, _, _ in handles],
        "usage": usage(prompt_tokens, completion_tokens, cached_tokens(handles, body.n)),
    })


async def stream(state, handles, header, body, prompt_tokens: int, kind: str):
    chunk_object = "chat.completion.chunk" if kind == "chat" else "text_completion"
    pending = {sequence_id: (choice, events) for choice, sequence_id, events in handles}
    merged: asyncio.Queue = asyncio.Queue()
    failed = False

    async def forward(sequence_id, events):
        while True:
            await merged.put((sequence_id, await events.get()))

    forwarders = [asyncio.ensure_future(forward(sequence_id, events)) for sequence_id, (_, events) in pending.items()]
    try:
        if kind == "chat":
            for choice, _, _ in handles:
                yield sse({**header, "object": chunk_object, "choices": [choice.role_chunk()]})
        while pending:
            sequence_id, item = await merged.get()
            if sequence_id not in pending:
                continue
            choice, _ = pending[sequence_id]
            for chunk_choice in choice.take(item, state, choice.started):
                yield sse({**header, "object": chunk_object, "choices": [chunk_choice]})
            if choice.done:
                if choice.cancel_engine:
                    state.runtime.cancel(sequence_id)
                if choice.failure:
                    failed = True
                    yield sse(errors.error_body(503, choice.failure))
                del pending[sequence_id]
        if body.stream_options and body.stream_options.include_usage:
            completion_tokens = sum(choice.tokens for choice, _, _ in handles)
            yield sse({**header, "object": chunk_object, "choices": [],
                       "usage": usage(prompt_tokens, completion_tokens, cached_tokens(handles, body.n))})
        yield "data: [DONE]\n\n"
    finally:
        for forwarder in forwarders:
            forwarder.cancel()
        for sequence_id in pending:  # the client went away
            state.runtime.cancel(sequence_id)
        if pending:
            log.info("%s: the client left the stream; cancelled %d unfinished sequence(s) (499)", header["id"], len(pending))
        state.metrics.requests.labels("cancelled" if pending else "failed" if failed else "completed").inc()


async def one_choice_events(state, handle, request_id: str, builder):
    """One choice's stream in another API's events (the Responses API's, Anthropic's): `builder`
    gives start() events, feed(chunk) events per chat chunk, finish(choice) events at the end and
    failed(message) one event when the engine failed under it. A client that leaves cancels the
    sequence; the request is counted by how it ended."""
    (choice, sequence_id, queue) = handle
    ended = False
    try:
        for event in builder.start():
            yield event
        while not choice.done:
            for chunk in choice.take(await queue.get(), state, choice.started):
                for event in builder.feed(chunk):
                    yield event
        if choice.cancel_engine:
            state.runtime.cancel(sequence_id)
        ended = True
        if choice.failure:
            yield builder.failed(choice.failure)
        else:
            for event in builder.finish(choice):
                yield event
    finally:
        if not ended:  # the client went away
            state.runtime.cancel(sequence_id)
            log.info("%s: the client left the stream; cancelled its sequence (499)", request_id)
        state.metrics.requests.labels("failed" if choice.failure else "completed" if ended else "cancelled").inc()


def usage(prompt_tokens: int, completion_tokens: int, cached: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached}}


def cached_tokens(handles, n: int) -> int:
    """Prompt tokens served from the prefix cache, counted once per prompt as prompt_tokens are:
    its first choice's sequence (the others of an n > 1 request map that one's pages)."""
    return sum(choice.cached_tokens for choice, _, _ in handles[::n])


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
