"""GET /v1/models, /v1/models/{name}, /health and /metrics."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..errors import ApiError, error_response

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    state = request.app.state.trellisforge
    reason = state.unavailable()
    if reason is not None:
        return error_response(503, reason)
    return {"status": "ok", "model": state.config.model_name}


@router.get("/metrics")
async def metrics(request: Request):
    state = request.app.state.trellisforge
    if state.runtime is not None:
        state.metrics.update_engine(state.runtime.stats)
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/v1/models")
async def models(request: Request):
    state = request.app.state.trellisforge
    return {"object": "list", "data": [model_card(state)]}


@router.get("/v1/models/{name:path}")
async def model(name: str, request: Request):
    state = request.app.state.trellisforge
    if name != state.config.model_name:
        raise ApiError(404, f"model '{name}' does not exist", param="model", code="model_not_found")
    return model_card(state)


def model_card(state) -> dict:
    card = {"id": state.config.model_name, "object": "model", "created": state.created, "owned_by": "trellisforge"}
    if state.engine is not None:
        card["max_model_len"] = state.engine.context_tokens_max  # vLLM's name: what clients size prompts by
    return card
