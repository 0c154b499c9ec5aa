"""What one server holds: its configuration, the model (tokenizer, engine, the runtime's loop
thread, the structured-output grammars) loaded in a background thread after the server starts
listening, and its metrics. /health answers 503 while the model loads, and with the cause if it
failed; a failure is also logged as an error line, and the server exits unless told to stay up."""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

import trellisforge
from trellisforge.engine import PAGE_TOKENS
from trellisforge.tokenizer import Tokenizer

from .errors import ApiError
from .metrics import Metrics
from .runtime import Runtime
from .response_store import ResponseStore
from .structured import Grammars

log = logging.getLogger("trellisforge")


@dataclasses.dataclass
class ServerConfig:
    model_dir: str
    model_name: str
    api_key: str | None = None
    backend: str = "cpu"
    max_seqs: int = 16
    ctx: int = 0
    kv_tokens: int = 0  # the shared KV pool's positions (0: the engine's default)
    rows_max: int = 256
    tp_world: int = 1
    tp_master: str | None = None
    max_body_mb: float = 8.0
    prefix_cache: bool = True
    kv_dtype: str = "f16"
    responses_store_mb: float = 256.0  # the Responses API's stored responses (0: none kept)


class State:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.metrics = Metrics()
        self.runtime: Runtime | None = None
        self.tokenizer: Tokenizer | None = None
        self.engine: trellisforge.Engine | None = None
        self.grammars: Grammars | None = None
        self.load_error: str | None = None
        self.ready = threading.Event()
        self.created = int(time.time())
        self.responses = ResponseStore(int(config.responses_store_mb * (1 << 20)))
        # Called (from the loading thread) when the model cannot load: __main__ stops the server.
        self.on_load_failure: Callable[[str], None] | None = None

    def load(self) -> None:
        c = self.config
        started = time.monotonic()
        try:
            self.tokenizer = Tokenizer(c.model_dir)
            kv_pages = -(-c.kv_tokens // PAGE_TOKENS)
            self.engine = trellisforge.Engine(c.model_dir, backend=c.backend, max_seqs=c.max_seqs, ctx=c.ctx, rows_max=c.rows_max,
                                              kv_pages=kv_pages, page_tokens=PAGE_TOKENS,
                                              tp_world=c.tp_world, tp_master=c.tp_master, prefix_cache=c.prefix_cache,
                                              kv_dtype=c.kv_dtype)
            self.grammars = Grammars(self.tokenizer.json_text, self.engine.vocab_size, self.engine.eos_token_ids,
                                     self.tokenizer.token_id)
            self.runtime = Runtime(self.engine, self.metrics)
            self.runtime.start()
        except Exception as error:  # noqa: BLE001 -- any cause is reported, none may pass silently
            self.load_error = f"{type(error).__name__}: {error}"
            log.error("the model in %s failed to load (%s backend): %s", c.model_dir, c.backend, self.load_error)
            if self.on_load_failure is not None:
                self.on_load_failure(self.load_error)
            return
        log.info("model %s loaded on the %s backend in %.1f s; ready", c.model_name, c.backend, time.monotonic() - started)
        self.ready.set()

    def shutdown(self) -> None:
        if self.runtime is not None:
            self.runtime.stop()
        if self.engine is not None:
            self.engine.close()

    def unavailable(self) -> str | None:
        """Why requests cannot be served now (loading, a load failure, a failed engine), or None."""
        if self.load_error:
            return f"model failed to load: {self.load_error}"
        if not self.ready.is_set():
            return "the model is still loading"
        if not self.runtime.alive:
            return self.runtime.failure or "the engine stopped"
        return None

    def require_ready(self, model_name: str) -> None:
        """Raises the ApiError a generation request gets when it cannot be served now."""
        reason = self.unavailable()
        if reason is not None:
            raise ApiError(503, reason)
        if model_name != self.config.model_name:
            raise ApiError(404, f"model '{model_name}' does not exist; this server serves '{self.config.model_name}'",
                           param="model", code="model_not_found")

    def hidden_ids(self, kept: set[int]) -> frozenset:
        """Special tokens whose text never reaches a client ([gMASK], <|user|>, ...), except
        `kept`, the tags a parser reads (<think>, <tool_call>, ...)."""
        return frozenset(self.tokenizer.special_ids - kept)
