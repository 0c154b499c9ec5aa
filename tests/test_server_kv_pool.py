"""The server's shared KV pool (`--kv-tokens`): the default context is what the pool holds (and
/v1/models says it as max_model_len), a prompt may use most of it, concurrent requests that
outgrow it are preempted and still answer exactly what each answers alone (counted in /metrics),
and a --ctx the pool cannot hold stops the server with a clear error."""
from __future__ import annotations

import concurrent.futures
import subprocess
import sys

import httpx
import openai
import pytest
from conftest import ROOT
from glm_fixtures import checkpoint_dir
from server_process import running_server


def preemptions(base: str) -> float:
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith("trellisforge_preemptions "):
            return float(line.split()[-1])
    raise AssertionError("no trellisforge_preemptions in /metrics")


@pytest.fixture(scope="module")
def server():
    with running_server("--model", str(checkpoint_dir("3.0")), "--model-name", "glm-tiny", "--max-seqs", "4",
                        "--kv-tokens", "256", "--rows-max", "32") as (base, _):
        yield base, openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120)


def test_the_context_is_the_pools_and_a_long_prompt_takes_most_of_it(server):
    base, client = server
    assert httpx.get(f"{base}/v1/models").json()["data"][0]["max_model_len"] == 256
    prompt = list(range(5, 205))  # 200 token ids
    reply = client.completions.create(model="glm-tiny", prompt=prompt, max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    assert reply.usage.prompt_tokens == 200 and reply.usage.completion_tokens == 40
    refused = httpx.post(f"{base}/v1/completions", json={"model": "glm-tiny", "prompt": list(range(5, 262)), "max_tokens": 1})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"


def test_requests_that_outgrow_the_pool_are_preempted_and_answer_as_alone(server):
    base, client = server
    prompts = [list(range(10 + 7 * i, 10 + 7 * i + 60)) for i in range(4)]  # 4 x (60 + 60) > 256

    def ask(prompt, seed):
        reply = client.completions.create(model="glm-tiny", prompt=prompt, max_tokens=60, temperature=0.9, seed=seed, logprobs=1,
                                          extra_body={"ignore_eos": True})
        return reply.choices[0].text, reply.choices[0].logprobs.token_logprobs

    alone = [ask(prompt, seed) for seed, prompt in enumerate(prompts)]
    before = preemptions(base)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(ask, prompts, range(4)))
    assert preemptions(base) > before
    assert together == alone


def serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "server", "--model", str(checkpoint_dir("3.0")), "--port", "0", *args], cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT / "python"), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)


def test_a_context_the_pool_cannot_hold_stops_the_server():
    done = serve("--kv-tokens", "256", "--ctx", "512")
    assert done.returncode == 1
    assert "context_tokens_max 512 does not fit the KV pool (16 pages of 16 tokens)" in done.stdout + done.stderr


@pytest.mark.parametrize("flag", ["--kv-tokens", "--ctx"])
def test_a_negative_size_is_refused_before_anything_loads(flag):
    done = serve(flag, "-5")
    assert done.returncode == 2 and "must not be negative" in done.stderr
