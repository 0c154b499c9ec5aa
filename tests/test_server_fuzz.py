"""A bounded fuzz pass over the request schema: hypothesis builds request bodies from the fields the
API knows, with values of every JSON type, strings with lone surrogates among them (and a few unknown
fields); no request may get a 500, and every error must be an OpenAI error body (under /v1/messages
also Anthropic's, with its content blocks, tools and fields fuzzed the same way)."""
from __future__ import annotations

import json

import httpx
import pytest
from glm_fixtures import checkpoint_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_process import running_server

# Text as JSON can carry it: any code point, lone surrogates ("\ud800") included.
TEXT = st.text(max_size=20) | st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), max_size=4)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10 ** 12, 10 ** 12) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=6,
)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "tool", "bogus"]) | JSON_VALUES,
                                 "content": st.text(max_size=40) | TEXT | JSON_VALUES})
FIELDS = {
    "model": st.just("glm-tiny") | JSON_VALUES,
    "messages": st.lists(MESSAGE, max_size=3) | JSON_VALUES,
    "prompt": st.text(max_size=40) | TEXT | st.lists(st.integers(-5, 3000), max_size=5) | JSON_VALUES,
    "max_tokens": st.integers(-3, 10 ** 10) | JSON_VALUES,
    "temperature": st.floats(-1, 3, allow_nan=False) | JSON_VALUES,
    "top_p": st.floats(-1, 2, allow_nan=False) | JSON_VALUES,
    "top_k": st.integers(-5, 5000) | JSON_VALUES,
    "n": st.integers(-1, 10) | JSON_VALUES,
    "seed": st.integers(-(2 ** 70), 2 ** 70) | JSON_VALUES,
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=20) | JSON_VALUES,
    "stream": st.booleans() | JSON_VALUES,
    "logprobs": st.booleans() | st.integers(-2, 30) | JSON_VALUES,
    "top_logprobs": st.integers(-2, 30) | JSON_VALUES,
    "tools": JSON_VALUES,
    "tool_choice": st.sampled_from(["auto", "none", "required"]) | JSON_VALUES,
    "response_format": st.sampled_from([{"type": "json_object"}, {"type": "text"}]) | st.fixed_dictionaries(
        {"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries({"name": TEXT, "schema": JSON_VALUES})}) | JSON_VALUES,
    "presence_penalty": st.floats(-3, 3, allow_nan=False) | JSON_VALUES,
    "unknown_field": JSON_VALUES,
}
BLOCK = st.fixed_dictionaries({"type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image", "bogus"]) | JSON_VALUES},
                              optional={"text": TEXT | JSON_VALUES, "id": TEXT | JSON_VALUES, "name": TEXT | JSON_VALUES,
                                        "input": JSON_VALUES, "tool_use_id": TEXT | JSON_VALUES, "content": TEXT | JSON_VALUES,
                                        "thinking": TEXT | JSON_VALUES, "is_error": JSON_VALUES})
ANTHROPIC_FIELDS = FIELDS | {
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "bogus"]) | JSON_VALUES,
                                                "content": TEXT | st.lists(BLOCK, max_size=3) | JSON_VALUES}), max_size=3) | JSON_VALUES,
    "system": TEXT | st.lists(BLOCK, max_size=2) | JSON_VALUES,
    "stop_sequences": st.lists(TEXT, max_size=3) | JSON_VALUES,
    "tools": st.lists(st.fixed_dictionaries({"name": TEXT | JSON_VALUES, "input_schema": JSON_VALUES},
                                            optional={"type": TEXT | JSON_VALUES}), max_size=2) | JSON_VALUES,
    "tool_choice": st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "tool", "none"]) | JSON_VALUES},
                                         optional={"name": TEXT | JSON_VALUES}) | JSON_VALUES,
    "thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled"]) | JSON_VALUES}) | JSON_VALUES,
}


@pytest.fixture(scope="module")
def base():
    with running_server("--model", str(checkpoint_dir("3.0")), "--model-name", "glm-tiny", "--ctx", "48",
                        "--max-seqs", "8") as (url, _):
        yield url


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(endpoint=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
       body=st.fixed_dictionaries({}, optional=FIELDS) | JSON_VALUES)
def test_no_request_gets_a_500(base, endpoint, body):
    # json.dumps escapes lone surrogates as \ud800, as a JavaScript client would send them.
    response = httpx.post(f"{base}{endpoint}", content=json.dumps(body), headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code < 500 or response.status_code == 503, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"] and "type" in error


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.fixed_dictionaries({}, optional=ANTHROPIC_FIELDS) | JSON_VALUES)
def test_no_messages_request_gets_a_500(base, body):
    response = httpx.post(f"{base}/v1/messages", content=json.dumps(body), headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code < 500 or response.status_code == 503, response.text
    if response.status_code >= 400:
        out = response.json()
        assert out["type"] == "error" and isinstance(out["error"]["message"], str) and out["error"]["message"]
