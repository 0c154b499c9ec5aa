"""The FastAPI application: the routes (routes/), OpenAI-shaped errors (errors.py), and two plain
ASGI middlewares, the API key (auth.py) and the body limit (body_limit.py). The model loads in a
background thread once the server listens (state.py)."""
from __future__ import annotations

import asyncio
import contextlib
import threading

from fastapi import FastAPI

import trellisforge

from . import errors
from .auth import ApiKey
from .body_limit import BodyLimit
from .routes import chat, completions, messages, models, responses, tokens
from .state import ServerConfig, State

__all__ = ["ServerConfig", "create_app"]


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
    for module in (chat, completions, messages, models, responses, tokens):
        app.include_router(module.router)
    # The last added runs first: an oversized body is refused before the key is even read.
    app.add_middleware(ApiKey, key=config.api_key)
    app.add_middleware(BodyLimit, limit_bytes=int(config.max_body_mb * (1 << 20)))
    return app
