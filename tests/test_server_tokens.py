"""POST /tokenize and /detokenize (vLLM's shapes): a prompt's count is the prompt_tokens the
completion reports, a chat's the prompt_tokens the chat completion reports (through the
checkpoint's template, with and without tools), the tokens decode back to the text, and bad requests get a 400 or 404 that says why."""
from __future__ import annotations

import httpx
import openai
import pytest
from glm_fixtures import checkpoint_dir
from server_process import running_server

from trellisforge.tokenizer import Tokenizer

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def server():
    with running_server("--model", str(checkpoint_dir("3.0")), "--model-name", "glm-tiny") as (base, _):
        yield base, openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120)


def post(base: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{base}{path}", json=body, timeout=30)


def test_a_prompts_count_is_what_a_completion_reports(server):
    base, client = server
    text = "The history of the world, told briefly."
    counted = post(base, "/tokenize", {"model": "glm-tiny", "prompt": text}).json()
    assert counted["tokens"] == Tokenizer(checkpoint_dir("3.0")).encode(text)
    assert counted["count"] == len(counted["tokens"]) == client.completions.create(model="glm-tiny", prompt=text, max_tokens=1).usage.prompt_tokens
    assert counted["max_model_len"] == client.models.list().data[0].model_extra["max_model_len"]
    assert post(base, "/detokenize", {"tokens": counted["tokens"]}).json() == {"prompt": text}
    long = post(base, "/tokenize", {"prompt": "word " * 5000}).json()  # counted, though past the context
    assert long["count"] == len(long["tokens"]) > long["max_model_len"]


def test_a_chats_count_is_what_a_chat_completion_reports(server):
    base, client = server
    for tools in (None, TOOLS):
        body = {"messages": MESSAGES} | ({"tools": tools} if tools else {})
        counted = post(base, "/tokenize", body).json()
        chat = client.chat.completions.create(model="glm-tiny", messages=MESSAGES, max_tokens=1, **({"tools": tools} if tools else {}))
        assert counted["count"] == len(counted["tokens"]) == chat.usage.prompt_tokens


@pytest.mark.parametrize("path,body,status,param", [
    ("/tokenize", {}, 400, None),
    ("/tokenize", {"prompt": "hi", "messages": MESSAGES}, 400, None),
    ("/tokenize", {"prompt": "hi", "tools": TOOLS}, 400, None),
    ("/tokenize", {"messages": [{"role": "user", "content": "word " * 50000}]}, 400, "messages"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "hi"}]}, 400, None),
    ("/tokenize", {"prompt": "hi", "model": "other"}, 404, "model"),
    ("/detokenize", {"tokens": [1, 10 ** 9]}, 400, "tokens"),
    ("/detokenize", {"tokens": "abc"}, 400, None),
])
def test_bad_requests_say_why(server, path, body, status, param):
    base, _ = server
    reply = post(base, path, body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["message"] and (param is None or error["param"] == param), error


def test_they_need_the_api_key_when_one_is_set():
    with running_server("--model", str(checkpoint_dir("3.0")), "--api-key", "sesame") as (base, _):
        assert post(base, "/tokenize", {"prompt": "hi"}).status_code == 401
        assert post(base, "/detokenize", {"tokens": [1]}).status_code == 401
        keyed = httpx.post(f"{base}/tokenize", json={"prompt": "hi"}, headers={"authorization": "Bearer sesame"}, timeout=30)
        assert keyed.status_code == 200 and keyed.json()["count"] > 0
