"""The OpenAI-compatible server as a real process on loopback, driven by the official `openai`
client (and raw HTTP where the client would not send the bad input)."""
from __future__ import annotations

import asyncio
import json
import re
import signal

import httpx
import openai
import pytest
from glm_fixtures import checkpoint_dir
from server_process import running_server

from trellisforge.tokenizer import Tokenizer

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France, and why is it famous?"}]


@pytest.fixture(scope="module")
def server():
    with running_server("--model", str(checkpoint_dir("3.0")), "--model-name", "glm-tiny", "--max-seqs", "20") as (base, process):
        yield base, process
    assert process.returncode == 0, "Ctrl-C should shut the server down cleanly"
    output = process.stdout.read()
    assert "Traceback" not in output and "trellisforge: stopped" in output, output


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(checkpoint_dir("3.0"))


def metric(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics").text
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1))


def test_chat_completion_and_usage(client, tokenizer):
    reply = client.chat.completions.create(model="glm-tiny", messages=MESSAGES, max_tokens=12, temperature=0)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.finish_reason == "length" and isinstance(choice.message.content, str)
    assert reply.usage.prompt_tokens == len(tokenizer.encode_chat(MESSAGES))
    assert reply.usage.completion_tokens == 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 12
    assert choice.logprobs is None  # not asked for


def test_streaming_equals_non_streaming(client):
    whole = client.chat.completions.create(model="glm-tiny", messages=MESSAGES, max_tokens=16, temperature=0)
    chunks = list(client.chat.completions.create(model="glm-tiny", messages=MESSAGES, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16


def test_completions_with_text_and_token_prompts(client, tokenizer):
    text = "The history of the printing press"
    by_text = client.completions.create(model="glm-tiny", prompt=text, max_tokens=8, temperature=0)
    by_ids = client.completions.create(model="glm-tiny", prompt=tokenizer.encode(text), max_tokens=8, temperature=0)
    assert by_text.choices[0].text == by_ids.choices[0].text
    assert by_text.usage.prompt_tokens == len(tokenizer.encode(text)) and by_text.usage.completion_tokens == 8


def test_stop_strings(client):
    free = client.completions.create(model="glm-tiny", prompt="The history of", max_tokens=24, temperature=0).choices[0].text
    assert len(free) > 6
    stop = free[3:6]
    stopped = client.completions.create(model="glm-tiny", prompt="The history of", max_tokens=24, temperature=0, stop=[stop, "zzzz"])
    assert stopped.choices[0].text == free[: free.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


def test_seeds(client):
    def sample(seed):
        return client.chat.completions.create(model="glm-tiny", messages=MESSAGES, max_tokens=16, temperature=1.0,
                                              seed=seed).choices[0].message.content
    assert sample(42) == sample(42)
    assert sample(42) != sample(43)


def test_n_choices(client):
    reply = client.chat.completions.create(model="glm-tiny", messages=MESSAGES, max_tokens=10, temperature=1.0, n=2, seed=5)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[0].message.content != reply.choices[1].message.content
    assert reply.usage.completion_tokens == 20


def test_logprobs(client):
    reply = client.chat.completions.create(model="glm-tiny", messages=MESSAGES, max_tokens=6, temperature=0,
                                           logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == 6 == reply.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy picks the top token
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
    assert "".join(bytes(e.bytes).decode("utf-8", "replace") for e in content).startswith(reply.choices[0].message.content[:1])


def test_models_health_and_metrics(server, client):
    base, _ = server
    assert [m.id for m in client.models.list().data] == ["glm-tiny"]
    assert httpx.get(f"{base}/health").json()["status"] == "ok"
    text = httpx.get(f"{base}/metrics").text
    for name in ("trellisforge_requests_running", "trellisforge_requests_waiting", "trellisforge_prompt_tokens_total",
                 "trellisforge_generation_tokens_total", "trellisforge_time_to_first_token_seconds_bucket",
                 "trellisforge_inter_token_latency_seconds_bucket", "trellisforge_kv_pages_used", "trellisforge_kv_pages_free"):
        assert name in text, name
    assert metric(base, "trellisforge_generation_tokens_total") > 0


def test_unknown_model(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4", messages=MESSAGES, max_tokens=2)
    assert caught.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("body,param", [
    ({"model": "glm-tiny", "messages": MESSAGES, "max_tokens": -5}, "max_tokens"),
    ({"model": "glm-tiny", "messages": MESSAGES, "max_tokens": 10 ** 9}, "max_tokens"),
    ({"model": "glm-tiny", "messages": MESSAGES, "temperature": "hot"}, "temperature"),
    ({"model": "glm-tiny", "messages": "hello"}, "messages"),
    ({"model": "glm-tiny", "messages": MESSAGES, "frobnicate": True}, "frobnicate"),
    ({"model": "glm-tiny", "messages": []}, "messages"),
    ({"model": "glm-tiny", "messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ({"messages": MESSAGES}, "model"),
])
def test_bad_requests_get_openai_errors(server, body, param):
    response = httpx.post(f"{server[0]}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_malformed_json(server):
    response = httpx.post(f"{server[0]}/v1/chat/completions", content=b'{"model": "glm-tiny", "messages": [',
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]


def test_oversize_prompt(server):
    long_text = "the history of the printing press " * 2000
    response = httpx.post(f"{server[0]}/v1/completions", json={"model": "glm-tiny", "prompt": long_text, "max_tokens": 4}, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_concurrent_streams_and_a_disconnect(server, client):
    """16 streams at once, one dropped mid-way: the other 15 produce what they produce alone and
    every KV page comes back."""
    base, _ = server
    prompts = [f"Story number {i}: once upon a time" for i in range(16)]
    alone = [client.completions.create(model="glm-tiny", prompt=p, max_tokens=12, temperature=0.8, seed=i).choices[0].text
             for i, p in enumerate(prompts)]

    async def one(i: int, session: httpx.AsyncClient):
        body = {"model": "glm-tiny", "prompt": prompts[i], "max_tokens": 12, "temperature": 0.8, "seed": i, "stream": True}
        text, received = "", 0
        async with session.stream("POST", f"{base}/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                text += json.loads(line[6:])["choices"][0]["text"]
                received += 1
                if i == 7 and received == 2:
                    return None  # leave mid-stream: the connection closes
        return text

    async def all_streams():
        async with httpx.AsyncClient(timeout=120) as session:
            return await asyncio.gather(*(one(i, session) for i in range(16)))

    results = asyncio.run(all_streams())
    for i, text in enumerate(results):
        if i != 7:
            assert text == alone[i], i
    for _ in range(50):
        if metric(base, "trellisforge_kv_pages_used") == 0 and metric(base, "trellisforge_requests_running") == 0:
            break
        asyncio.run(asyncio.sleep(0.1))
    assert metric(base, "trellisforge_kv_pages_used") == 0
    assert metric(base, "trellisforge_requests_running") == 0


def test_api_key():
    with running_server("--model", str(checkpoint_dir("3.0")), "--model-name", "glm-tiny", "--api-key", "sesame") as (base, _):
        body = {"model": "glm-tiny", "prompt": "hi", "max_tokens": 1}
        missing = httpx.post(f"{base}/v1/completions", json=body)
        wrong = httpx.post(f"{base}/v1/completions", json=body, headers={"authorization": "Bearer nope"})
        assert missing.status_code == wrong.status_code == 401
        assert wrong.json()["error"]["type"] == "authentication_error"
        right = openai.OpenAI(base_url=f"{base}/v1", api_key="sesame", max_retries=0)
        assert right.completions.create(model="glm-tiny", prompt="hi", max_tokens=1).choices[0].text is not None
        assert httpx.get(f"{base}/health").status_code == 200
        # A stored response is read and deleted with the key only.
        stored = right.responses.create(model="glm-tiny", input="hi", max_output_tokens=1).id
        for method in ("GET", "DELETE"):
            for path in (f"/v1/responses/{stored}", f"/v1/responses/{stored}/input_items"):
                assert httpx.request(method, f"{base}{path}").status_code == 401
        assert right.responses.retrieve(stored).id == stored
        # Anthropic's clients send the key as x-api-key; their errors come in Anthropic's shape.
        anthropic = {"model": "glm-tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
        refused = httpx.post(f"{base}/v1/messages", json=anthropic, headers={"x-api-key": "nope"})
        assert refused.status_code == 401 and refused.json()["type"] == "error"
        assert refused.json()["error"]["type"] == "authentication_error"
        assert httpx.post(f"{base}/v1/messages", json=anthropic).status_code == 401
        assert httpx.post(f"{base}/v1/messages", json=anthropic, headers={"x-api-key": "sesame"}, timeout=60).status_code == 200
