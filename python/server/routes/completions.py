"""POST /v1/completions: one prompt or a list of them (text or token ids), n choices each."""
from __future__ import annotations

from fastapi import APIRouter, Request

from ..cancellation import cancel_on_disconnect
from ..errors import ApiError
from ..request_body import JsonRoute
from ..schemas import CompletionRequest
from ..serving import Plan, encode, generate

router = APIRouter(route_class=JsonRoute)


@router.post("/v1/completions")
@cancel_on_disconnect
async def completions(body: CompletionRequest, request: Request):
    state = request.app.state.trellisforge
    state.require_ready(body.model)
    prompts = []
    for index, prompt in enumerate(body.prompts()):
        where = "prompt" if len(body.prompts()) == 1 else f"prompt.{index}"
        if isinstance(prompt, str):
            prompt = await encode(state, prompt, where)
        elif any(t >= state.engine.vocab_size for t in prompt):
            raise ApiError(400, f"{where}: token ids must be below the vocabulary size {state.engine.vocab_size}", param=where,
                           code="token_out_of_vocabulary")
        prompts.append(prompt)
    plan = Plan(kind="text", prompts=prompts, max_tokens=body.max_tokens,
                hidden_ids=state.hidden_ids(set()) if body.skip_special_tokens else frozenset())
    return await generate(state, body, plan)
