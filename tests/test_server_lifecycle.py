"""The server as a user meets it: a client that leaves a non-streamed request (chat and completion,
n = 2) stops its generation and frees its pages within a bound, counted as cancelled; strings that
cannot be text get a 400 in every field, never a 500; an oversized body gets a 413 while /health
keeps answering, and so does a huge prompt being tokenized; a model that cannot load says so and
exits 1 (or keeps /health up when asked)."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from conftest import ROOT
from glm_fixtures import checkpoint_dir
from server_process import free_port, running_server

MESSAGES = [{"role": "user", "content": "Tell me a long story about the sea."}]
FREED_WITHIN_S = 3.0  # a CPU step of the fixture takes milliseconds; this bounds "within one step" loosely


@pytest.fixture(scope="module")
def base():
    with running_server("--model", str(checkpoint_dir("3.0")), "--model-name", "glm-tiny", "--max-seqs", "8") as (url, _):
        yield url


def metric(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics").text
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def wait_for(condition, timeout_s: float) -> float | None:
    """Seconds until condition() held, or None."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if condition():
            return time.monotonic() - started
        time.sleep(0.02)
    return None


@pytest.mark.parametrize("endpoint,fields", [("/v1/completions", {"prompt": "Once upon a time"}),
                                             ("/v1/chat/completions", {"messages": MESSAGES})])
def test_a_client_leaving_a_non_streamed_request_cancels_it(base, endpoint, fields):
    cancelled = metric(base, 'trellisforge_requests_total{outcome="cancelled"}')
    body = json.dumps({"model": "glm-tiny", "temperature": 1.0, "n": 2, "ignore_eos": True, **fields}).encode()
    port = int(base.rsplit(":", 1)[1])
    client = socket.create_connection(("127.0.0.1", port))
    client.sendall(f"POST {endpoint} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    # No max_tokens and EOS ignored: both choices would run to the end of the context (4096).
    assert wait_for(lambda: metric(base, "trellisforge_requests_running") == 2 and
                    metric(base, "trellisforge_generation_tokens_total") > 0, 30) is not None
    client.close()
    freed_after = wait_for(lambda: metric(base, "trellisforge_kv_pages_used") == 0 and
                           metric(base, "trellisforge_requests_running") == 0, FREED_WITHIN_S)
    assert freed_after is not None, "the sequences outlived their client"
    print(f"{endpoint}: pages freed {freed_after * 1000:.0f} ms after the client left")
    generated = metric(base, "trellisforge_generation_tokens_total")
    time.sleep(0.3)
    assert metric(base, "trellisforge_generation_tokens_total") == generated  # nothing runs on
    assert metric(base, 'trellisforge_requests_total{outcome="cancelled"}') == cancelled + 1


def test_a_client_leaving_while_choices_wait_on_the_first_prompt(base):
    """n = 4 on a prompt of many chunks: choices 2-4 wait for the first one's prompt (to map its
    pages). The client leaves during that prompt: nothing runs on, no page is held, and the waiting
    choices never start."""
    cancelled = metric(base, 'trellisforge_requests_total{outcome="cancelled"}')
    generated = metric(base, "trellisforge_generation_tokens_total")
    body = json.dumps({"model": "glm-tiny", "prompt": "A long shared prompt. " * 150, "n": 4, "max_tokens": 8}).encode()
    port = int(base.rsplit(":", 1)[1])
    client = socket.create_connection(("127.0.0.1", port))
    client.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    assert wait_for(lambda: metric(base, "trellisforge_requests_running") == 1, 30) is not None
    client.close()
    assert metric(base, "trellisforge_generation_tokens_total") == generated, "the first prompt ended before the client left"
    freed_after = wait_for(lambda: metric(base, "trellisforge_kv_pages_used") == 0 and
                           metric(base, "trellisforge_requests_running") == 0, FREED_WITHIN_S)
    assert freed_after is not None, "the sequences outlived their client"
    time.sleep(0.5)
    assert metric(base, "trellisforge_requests_running") == 0 and metric(base, "trellisforge_kv_pages_used") == 0
    assert metric(base, "trellisforge_generation_tokens_total") == generated  # no waiting choice started
    assert metric(base, 'trellisforge_requests_total{outcome="cancelled"}') == cancelled + 1


SURROGATE = "hi \ud800 there"
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}


def chat(**fields) -> dict:
    return {"model": "glm-tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


@pytest.mark.parametrize("body,where", [
    (chat(messages=[{"role": "user", "content": SURROGATE}]), "messages.0.content"),
    (chat(messages=[{"role": "user", "content": [{"type": "text", "text": SURROGATE}]}]), "messages.0.content.0.text"),
    (chat(messages=[{"role": "user", "content": "hi", "name": SURROGATE}]), "messages.0.name"),
    (chat(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"q": SURROGATE})}}]}]),
     "messages.1.tool_calls.0.function.arguments"),
    (chat(messages=[{"role": "tool", "content": "ok", "tool_call_id": SURROGATE}]), "messages.0.tool_call_id"),
    (chat(stop=["x", SURROGATE]), "stop.1"),
    (chat(stop=SURROGATE), "stop"),
    (chat(user=SURROGATE), "user"),
    (chat(metadata={"k": SURROGATE}), "metadata.k"),
    (chat(tools=[{**TOOL, "function": {**TOOL["function"], "description": SURROGATE}}]), "tools.0.function.description"),
    (chat(**{SURROGATE: 1}), None),
    ({"model": "glm-tiny", "prompt": SURROGATE, "max_tokens": 2}, "prompt"),
    ({"model": "glm-tiny", "prompt": ["fine", SURROGATE], "max_tokens": 2}, "prompt.1"),
    ({"model": SURROGATE, "prompt": "hi", "max_tokens": 2}, "model"),
])
def test_lone_surrogates_in_any_string_get_a_400(base, body, where):
    endpoint = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    response = httpx.post(f"{base}{endpoint}", content=json.dumps(body), headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_unicode" and "surrogate" in error["message"]
    if where is not None:
        assert error["param"] == where


def test_paired_surrogates_are_text(base):
    """An escaped pair is one character (here an emoji): a 200."""
    body = chat(messages=[{"role": "user", "content": "sea \U0001F30A waves"}])
    response = httpx.post(f"{base}/v1/chat/completions", content=json.dumps(body), headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text


def health_latencies(base: str, busy: threading.Event) -> list[float]:
    latencies = []
    with httpx.Client(timeout=10) as client:
        while not busy.is_set() or not latencies:
            started = time.monotonic()
            assert client.get(f"{base}/health").status_code == 200
            latencies.append(time.monotonic() - started)
            time.sleep(0.01)
    return latencies


def while_posting(base: str, content: bytes) -> tuple[httpx.Response, list[float]]:
    done = threading.Event()
    result = {}

    def post():
        result["response"] = httpx.post(f"{base}/v1/completions", content=content, headers={"content-type": "application/json"},
                                        timeout=120)
        done.set()

    poster = threading.Thread(target=post)
    poster.start()
    latencies = health_latencies(base, done)
    poster.join()
    return result["response"], latencies


def test_a_10_mb_body_gets_413_and_health_keeps_answering(base):
    content = b'{"model": "glm-tiny", "max_tokens": 2, "prompt": "' + b"the sea " * (10 * 2 ** 20 // 8) + b'"}'
    response, latencies = while_posting(base, content)
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "request_too_large" and "--max-body-mb" in response.json()["error"]["message"]
    assert max(latencies) < 0.1, f"/health took {max(latencies) * 1000:.0f} ms"


def test_huge_prompts_under_the_limit_never_stall_the_server(base):
    """7 MB of text, under the body limit: refused at once, untokenized (it cannot fit the context,
    whatever its tokens); 75 KB, which might: tokenized in a worker thread, then refused. /health
    answers throughout both."""
    for repeats, seconds_max in ((200_000, 1.0), (2_200, 5.0)):
        text = "the history of the printing press " * repeats
        content = json.dumps({"model": "glm-tiny", "max_tokens": 2, "prompt": text}).encode()
        started = time.monotonic()
        response, latencies = while_posting(base, content)
        elapsed = time.monotonic() - started
        assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
        print(f"{len(content) / 1e3:.0f} kB prompt: refused in {elapsed * 1000:.0f} ms ({response.json()['error']['message']}); "
              f"/health worst {max(latencies) * 1000:.1f} ms")
        assert elapsed < seconds_max and max(latencies) < 0.1


def test_max_body_mb_is_configurable():
    with running_server("--model", str(checkpoint_dir("3.0")), "--model-name", "glm-tiny", "--max-body-mb", "0.001") as (url, _):
        small = httpx.post(f"{url}/v1/completions", json={"model": "glm-tiny", "prompt": "hi", "max_tokens": 1})
        large = httpx.post(f"{url}/v1/completions", json={"model": "glm-tiny", "prompt": "hi " * 1000, "max_tokens": 1})
        chunked = httpx.post(f"{url}/v1/completions", content=iter([b'{"model": "glm-tiny", "prompt": "', b"hi " * 1000, b'"}']),
                             headers={"content-type": "application/json"})
        assert small.status_code == 200 and large.status_code == 413 and chunked.status_code == 413


def broken_model(tmp_path) -> str:
    """The fixture's files with an architecture no engine runs: the tokenizer loads, the model not."""
    model_dir = tmp_path / "broken"
    shutil.copytree(checkpoint_dir("3.0"), model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = ["MysteryForCausalLM"]
    (model_dir / "config.json").write_text(json.dumps(config))
    return str(model_dir)


def start(port: int, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "server", "--port", str(port), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_model_that_cannot_load_says_why_and_exits_1(tmp_path):
    process = start(free_port(), "--model", broken_model(tmp_path))
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1, output
    error_lines = [line for line in output.splitlines() if line.startswith("ERROR")]
    assert error_lines and "failed to load" in error_lines[0] and "MysteryForCausalLM" in error_lines[0], output
    assert "Traceback" not in output


def test_keep_serving_keeps_health_up_with_the_cause(tmp_path):
    with running_server_expecting_503("--model", broken_model(tmp_path), "--keep-serving") as (url, process):
        health = httpx.get(f"{url}/health")
        assert health.status_code == 503 and "MysteryForCausalLM" in health.json()["error"]["message"]
        chat_reply = httpx.post(f"{url}/v1/completions", json={"model": "broken", "prompt": "hi"})
        assert chat_reply.status_code == 503
        assert process.poll() is None


class running_server_expecting_503:
    """Like server_process.running_server, for a server whose /health is meant to say 503."""

    def __init__(self, *args: str):
        self.args = args

    def __enter__(self):
        port = free_port()
        self.process = start(port, *self.args)
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if "failed to load" in httpx.get(f"{url}/health", timeout=1).text:
                    return url, self.process
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("no failure reported")

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=30)
