"""The server on GLM-4.7-Flash (MLA), GLM-5.x (MLA + DSA) and GLM-5.3-Flash (KDA, pooled DSA,
hyper-connections) checkpoints, the fixtures of
../shared: a completion's text is the engine's greedy continuation of the same tokens, and a chat
request is templated by the checkpoint's own chat_template.jinja (the prompt the server counts is
the template's) and answered through the reasoning split."""
from __future__ import annotations

import openai
import pytest
from server_process import running_server
from test_mla_engine import FAMILIES, family_or_skip

import trellisforge
from trellisforge.tokenizer import Tokenizer

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name a prime number."}]


@pytest.fixture(scope="module", params=FAMILIES + ["glm5_next"])
def served(request):
    model = family_or_skip(request.param) / "exl3_3.0bpw"
    with running_server("--model", str(model), "--model-name", request.param, "--max-seqs", "4") as (base, _):
        yield model, request.param, openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120)


def test_a_completion_is_the_engines_greedy_continuation(served):
    model, name, client = served
    response = client.completions.create(model=name, prompt=PROMPT, max_tokens=8, temperature=0)
    tokenizer = Tokenizer(model)
    with trellisforge.Engine(model, max_seqs=1) as engine:
        tokens = engine.generate(tokenizer.encode(PROMPT), 8, stop_token_ids=[])
    used = response.usage.completion_tokens
    assert 1 <= used <= 8
    assert response.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    assert response.choices[0].text == tokenizer.decode(tokens[:used], skip_special_tokens=True)


def test_a_chat_is_templated_by_the_checkpoint(served):
    model, name, client = served
    response = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=6, temperature=0)
    assert response.usage.prompt_tokens == len(Tokenizer(model).encode_chat(MESSAGES))
    assert response.choices[0].finish_reason in ("stop", "length")
    message = response.choices[0].message
    assert message.role == "assistant" and (message.content is not None or getattr(message, "reasoning_content", None) is not None)
