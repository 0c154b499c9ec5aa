"""logit_bias through the server, on both endpoints: the text is what the engine gives with the same
bias (tests/test_logit_bias.py checks the engine against the exact reference), +100 forces a token,
and bad biases get a 400 that names logit_bias."""
from __future__ import annotations

import httpx
import openai
import pytest
from glm_fixtures import checkpoint_dir, prompts
from server_process import running_server

import trellisforge
from trellisforge import Sampling
from trellisforge.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def server():
    with running_server("--model", str(checkpoint_dir("3.0")), "--model-name", "glm-tiny") as (base, _):
        yield base, openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def engine():
    with trellisforge.Engine(checkpoint_dir("3.0"), max_seqs=2) as e:
        yield e


def test_a_bias_gives_the_engines_tokens_on_both_endpoints(server, engine):
    base, client = server
    prompt = prompts()["short"]
    free = engine.generate(prompt, 6, stop_token_ids=[])
    bias = {token: -100.0 for token in free[:3]} | {77: 4.5}
    expected = engine.generate(prompt, 6, stop_token_ids=[], logit_bias=tuple(bias.items()))
    assert expected[:3] != free[:3]
    tokenizer = Tokenizer(checkpoint_dir("3.0"))
    text = client.completions.create(model="glm-tiny", prompt=prompt, max_tokens=6, temperature=0,
                                     logit_bias={str(t): v for t, v in bias.items()}, extra_body={"ignore_eos": True})
    assert text.choices[0].text == tokenizer.decode(expected)
    unbiased = client.completions.create(model="glm-tiny", prompt=prompt, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert unbiased.choices[0].text == tokenizer.decode(free)

    messages = [{"role": "user", "content": "Name a colour."}]
    chat_prompt = tokenizer.encode_chat(messages)
    chat_free = engine.generate(chat_prompt, 4, stop_token_ids=[])
    chat_bias = {chat_free[0]: -100.0}
    chat_expected = engine.generate(chat_prompt, 4, stop_token_ids=[], logit_bias=tuple(chat_bias.items()))
    chat = client.chat.completions.create(model="glm-tiny", messages=messages, max_tokens=4, temperature=0, logprobs=True,
                                          logit_bias={str(chat_free[0]): -100}, extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert [entry.token for entry in chat.choices[0].logprobs.content] == [tokenizer.decode([t]) for t in chat_expected]


def test_plus_100_forces_a_sampled_token(server):
    _, client = server
    tokenizer = Tokenizer(checkpoint_dir("3.0"))
    stream = client.completions.create(model="glm-tiny", prompt="Once", max_tokens=5, temperature=1.2, seed=3, stream=True,
                                       logit_bias={"1234": 100}, extra_body={"ignore_eos": True})
    assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == tokenizer.decode([1234] * 5)


@pytest.mark.parametrize("bias, code", [
    ({"abc": 1}, "invalid_value"),
    ({"-5": 1}, "invalid_value"),
    ({"5": 100.5}, "invalid_value"),
    ({"5": "x"}, "invalid_value"),
    ({str(t): 1 for t in range(1025)}, "invalid_value"),
    ({"2048": 1}, "token_out_of_vocabulary"),
    ({"5": 1, "005": 2}, "invalid_value"),
])
@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_bad_biases_get_a_400_naming_logit_bias(server, bias, code, endpoint):
    base, _ = server
    body = {"prompt": "a"} if endpoint == "/v1/completions" else {"messages": [{"role": "user", "content": "a"}]}
    response = httpx.post(f"{base}{endpoint}", json={"model": "glm-tiny", "max_tokens": 2, "logit_bias": bias, **body}, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code and "logit" in error["message"], error
    if code == "token_out_of_vocabulary":
        assert error["param"] == "logit_bias"
    healthy = httpx.get(f"{base}/health", timeout=30)
    assert healthy.status_code == 200
