"""The FastAPI application: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics.

The engine loads in a background thread after the server starts listening, so /health answers 503
until it is ready (or says why it failed)."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import threading
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

import trellisforge
from trellisforge import TrellisError
from trellisforge.tokenizer import TemplateError, Tokenizer

from . import errors
from .errors import ApiError
from .generation import ChoiceState, sampling_for
from .metrics import Metrics
from .runtime import Runtime
from .schemas import ChatCompletionRequest, CompletionRequest

DISCONNECT_POLL_S = 0.25


@dataclasses.dataclass
class ServerConfig:
    model_dir: str
    model_name: str
    api_key: str | None = None
    backend: str = "cpu"
    max_seqs: int = 16
    ctx: int = 0
    rows_max: int = 256
    tp_world: int = 1
    tp_master: str | None = None


class State:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.metrics = Metrics()
        self.runtime: Runtime | None = None
        self.tokenizer: Tokenizer | None = None
        self.engine: trellisforge.Engine | None = None
        self.load_error: str | None = None
        self.ready = threading.Event()
        self.created = int(time.time())

    def load(self) -> None:
        try:
            c = self.config
            self.tokenizer = Tokenizer(c.model_dir)
            self.engine = trellisforge.Engine(c.model_dir, backend=c.backend, max_seqs=c.max_seqs, ctx=c.ctx, rows_max=c.rows_max,
                                              tp_world=c.tp_world, tp_master=c.tp_master)
            self.runtime = Runtime(self.engine, self.metrics)
            self.runtime.start()
            self.ready.set()
        except Exception as error:  # reported by /health and every request
            self.load_error = f"{type(error).__name__}: {error}"

    def shutdown(self) -> None:
        if self.runtime is not None:
            self.runtime.stop()
        if self.engine is not None:
            self.engine.close()


def create_app(config: ServerConfig, load_in_background: bool = True) -> FastAPI:
    state = State(config)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        loader = threading.Thread(target=state.load, name="trellisforge-load", daemon=True)
        loader.start()
        if not load_in_background:
            loader.join()
        yield
        await asyncio.get_running_loop().run_in_executor(None, state.shutdown)

    app = FastAPI(title="TrellisForge", version=trellisforge.version(), lifespan=lifespan)
    app.state.trellisforge = state
    errors.install(app)

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        if config.api_key and request.url.path.startswith("/v1/"):
            header = request.headers.get("authorization", "")
            token = header[7:] if header.lower().startswith("bearer ") else ""
            if not secrets.compare_digest(token.encode(), config.api_key.encode()):
                message = "missing API key" if not header else "invalid API key"
                return errors.error_response(401, message, code="invalid_api_key")
        return await call_next(request)

    @app.get("/health")
    async def health():
        if state.load_error:
            return errors.error_response(503, f"model failed to load: {state.load_error}")
        if not state.ready.is_set():
            return errors.error_response(503, "loading the model")
        if not state.runtime.alive:
            return errors.error_response(503, state.runtime.failure or "the engine stopped")
        return {"status": "ok", "model": config.model_name}

    @app.get("/metrics")
    async def metrics():
        if state.runtime is not None:
            state.metrics.update_engine(state.runtime.stats)
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card(config, state.created)]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        if name != config.model_name:
            raise ApiError(404, f"model '{name}' does not exist", param="model", code="model_not_found")
        return model_card(config, state.created)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        ready(state, body.model)
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools and body.tool_choice != "none" else None
        try:
            prompt_text = state.tokenizer.render_chat(template_messages(body), tools=tools, add_generation_prompt=True,
                                                      **(body.chat_template_kwargs or {}))
        except TemplateError as error:
            raise ApiError(400, str(error), param="messages") from None
        prompt = state.tokenizer.encode(prompt_text)
        max_tokens = body.max_completion_tokens or body.max_tokens
        return await run(state, request, body, prompt, max_tokens, kind="chat",
                         starts_in_reasoning=prompt_text.rstrip().endswith("<think>"), parse_tools=tools is not None)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        ready(state, body.model)
        prompt = body.prompt if isinstance(body.prompt, list) else state.tokenizer.encode(body.prompt)
        if any(t >= state.engine.vocab_size for t in prompt):
            raise ApiError(400, f"prompt token ids must be below the vocabulary size {state.engine.vocab_size}", param="prompt")
        return await run(state, request, body, prompt, body.max_tokens, kind="text")

    return app


def model_card(config: ServerConfig, created: int) -> dict:
    return {"id": config.model_name, "object": "model", "created": created, "owned_by": "trellisforge"}


def ready(state: State, model_name: str) -> None:
    if state.load_error:
        raise ApiError(503, f"model failed to load: {state.load_error}")
    if not state.ready.is_set():
        raise ApiError(503, "the model is still loading")
    if not state.runtime.alive:
        raise ApiError(503, state.runtime.failure or "the engine stopped")
    if model_name != state.config.model_name:
        raise ApiError(404, f"model '{model_name}' does not exist; this server serves '{state.config.model_name}'",
                       param="model", code="model_not_found")


def template_messages(body: ChatCompletionRequest) -> list[dict]:
    """OpenAI messages as chat templates expect them: tool results under role "tool" (GLM's
    templates render them as <|observation|>), assistant tool calls with parsed arguments."""
    out = []
    for message in body.messages:
        item: dict = {"role": "system" if message.role == "developer" else message.role, "content": message.text()}
        if message.reasoning_content:
            item["reasoning_content"] = message.reasoning_content
        if message.tool_calls:
            calls = []
            for call in message.tool_calls:
                try:
                    arguments = json.loads(call.function.arguments or "{}")
                except ValueError:
                    raise ApiError(400, "tool call arguments are not valid JSON", param="messages") from None
                calls.append({"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}})
            item["tool_calls"] = calls
        if message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        if message.name:
            item["name"] = message.name
        out.append(item)
    return out


async def run(state: State, request: Request, body, prompt: list[int], max_tokens: int | None, kind: str,
              starts_in_reasoning: bool = False, parse_tools: bool = False):
    context = state.engine.context_tokens_max
    if len(prompt) >= context:
        raise ApiError(400, f"the prompt has {len(prompt)} tokens; the context holds {context}", param="messages" if kind == "chat" else "prompt",
                       code="context_length_exceeded")
    limit = context - len(prompt)
    if max_tokens is not None and max_tokens > limit:
        raise ApiError(400, f"max_tokens {max_tokens} plus the prompt's {len(prompt)} tokens exceed the context of {context}",
                       param="max_tokens", code="context_length_exceeded")
    max_tokens = max_tokens or limit
    want_logprobs = bool(body.logprobs) if kind == "chat" else body.logprobs is not None
    choices = [ChoiceState(index, state.tokenizer, body.stop, state.engine.eos_token_ids, kind, starts_in_reasoning, parse_tools,
                           want_logprobs) for index in range(body.n)]
    started = time.monotonic()
    handles = []
    try:
        for choice in choices:
            sequence_id, events = await state.runtime.submit(prompt, sampling_for(body, max_tokens, choice.index), state.engine.eos_token_ids)
            handles.append((choice, sequence_id, events))
    except TrellisError as error:
        for _, sequence_id, _ in handles:
            state.runtime.cancel(sequence_id)
        status = 503 if "slots are in use" in str(error) or "KV pages" in str(error) else 400
        raise ApiError(status, str(error), code="overloaded" if status == 503 else "invalid_value") from None
    state.metrics.prompt_tokens.inc(len(prompt) * body.n)
    request_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
    header = {"id": request_id, "created": int(time.time()), "model": state.config.model_name}
    if body.stream:
        return StreamingResponse(stream(state, handles, header, body, len(prompt), kind, started), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await collect(state, request, handles, header, body, len(prompt), kind, started)


async def collect(state, request: Request, handles, header, body, prompt_tokens: int, kind: str, started: float):
    pending = {sequence_id: (choice, events) for choice, sequence_id, events in handles}
    try:
        while pending:
            for sequence_id, (choice, events) in list(pending.items()):
                while not events.empty():
                    choice.take(events.get_nowait(), state, started)
                if choice.done:
                    if choice.cancel_engine:
                        state.runtime.cancel(sequence_id)
                    del pending[sequence_id]
            if not pending:
                break
            waits = [asyncio.ensure_future(events.get()) for _, events in pending.values()]
            _, not_done = await asyncio.wait(waits, timeout=DISCONNECT_POLL_S, return_when=asyncio.FIRST_COMPLETED)
            for waiter in not_done:
                waiter.cancel()
            for (choice, _), waiter in zip(list(pending.values()), waits):
                # A waiter that finished just before its cancel still holds its item.
                if waiter.done() and not waiter.cancelled():
                    choice.take(waiter.result(), state, started)
            if await request.is_disconnected():
                return Response(status_code=499)
    finally:
        for sequence_id in pending:
            state.runtime.cancel(sequence_id)
    choices = [choice.final(kind) for choice, _, _ in handles]
    completion_tokens = sum(choice.tokens for choice, _, _ in handles)
    for choice, _, _ in handles:
        if choice.failure:
            raise ApiError(503, choice.failure)
    return JSONResponse({
        **header,
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    })


async def stream(state, handles, header, body, prompt_tokens: int, kind: str, started: float):
    chunk_object = "chat.completion.chunk" if kind == "chat" else "text_completion"
    pending = {sequence_id: (choice, events) for choice, sequence_id, events in handles}
    merged: asyncio.Queue = asyncio.Queue()

    async def forward(sequence_id, events):
        while True:
            item = await events.get()
            await merged.put((sequence_id, item))

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
            for chunk_choice in choice.take(item, state, started):
                yield sse({**header, "object": chunk_object, "choices": [chunk_choice]})
            if choice.done:
                if choice.cancel_engine:
                    state.runtime.cancel(sequence_id)
                if choice.failure:
                    yield sse(errors.error_body(503, choice.failure))
                del pending[sequence_id]
        if body.stream_options and body.stream_options.include_usage:
            completion_tokens = sum(choice.tokens for choice, _, _ in handles)
            yield sse({**header, "object": chunk_object, "choices": [],
                       "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                 "total_tokens": prompt_tokens + completion_tokens}})
        yield "data: [DONE]\n\n"
    finally:
        for forwarder in forwarders:
            forwarder.cancel()
        for sequence_id in pending:  # the client went away, or the server is stopping
            state.runtime.cancel(sequence_id)


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
