"""Structured outputs through the server: json_schema replies validate against their schema
(jsonschema) over many seeds of a random model at temperature 1, json_object replies parse, a
forced tool choice always yields a call whose arguments parse and fit the function's parameters,
and schemas or choices that cannot be enforced get a 400 naming the problem. On the scripted model,
a grammar waits for the end of reasoning: the reasoning comes out as it does unconstrained."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
import scripted_model
from glm_fixtures import checkpoint_dir
from server_process import scripted_server, served_with_client

QUESTION = [{"role": "user", "content": "Describe a city as JSON."}]
SCHEMAS = {
    "flat": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "population": {"type": "integer", "minimum": 0, "maximum": 99999},
        "capital": {"type": "boolean"},
        "kind": {"enum": ["town", "city", "village"]}},
        "required": ["name", "population", "capital", "kind"]},
    "nested": {"type": "object", "properties": {
        "districts": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 9}, "area": {"type": "number", "minimum": 0, "maximum": 10}},
            "required": ["id", "area"]}},
        "mayor": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^[A-Z][a-z]{1,6}$"}]}},
        "required": ["districts", "mayor"]},
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "number", "minimum": -100, "maximum": 100}, "b": {"type": "number", "minimum": -100, "maximum": 100}},
        "required": ["a", "b"], "additionalProperties": False}}},
]
SEEDS = range(3)  # x n = 4 choices each: 12 draws per case


@pytest.fixture(scope="module")
def client():
    with served_with_client("--model", str(checkpoint_dir("3.0")), "--model-name", "glm-tiny", "--max-seqs", "8", timeout=120) as (_, client):
        yield client


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_replies_validate(client, name):
    schema = SCHEMAS[name]
    for seed in SEEDS:
        reply = client.chat.completions.create(
            model="glm-tiny", messages=QUESTION, temperature=1.0, seed=seed, n=4, max_tokens=400,
            response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}})
        for choice in reply.choices:
            assert choice.finish_reason == "stop", choice.message.content
            jsonschema.validate(json.loads(choice.message.content), schema)


def test_strict_objects_take_no_extra_properties(client):
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    for seed in SEEDS:
        reply = client.chat.completions.create(
            model="glm-tiny", messages=QUESTION, temperature=1.0, seed=seed, n=4, max_tokens=200,
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}})
        for choice in reply.choices:
            assert list(json.loads(choice.message.content)) == ["a"]


def test_json_object_replies_parse(client):
    reply = client.chat.completions.create(model="glm-tiny", messages=QUESTION, temperature=0.7, seed=1, n=4, max_tokens=300,
                                           response_format={"type": "json_object"})
    for choice in reply.choices:
        if choice.finish_reason == "stop":  # a free object may run past max_tokens
            assert isinstance(json.loads(choice.message.content), dict)
    assert any(choice.finish_reason == "stop" for choice in reply.choices)


def test_streamed_json_schema_reply_validates(client):
    schema = SCHEMAS["flat"]
    chunks = client.chat.completions.create(model="glm-tiny", messages=QUESTION, temperature=1.0, seed=7, max_tokens=400, stream=True,
                                            response_format={"type": "json_schema", "json_schema": {"name": "f", "schema": schema}})
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)), schema)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_forced_tool_calls_always_parse_and_fit(client, tool_choice):
    for seed in SEEDS:
        reply = client.chat.completions.create(model="glm-tiny", messages=QUESTION, temperature=1.0, seed=seed, n=4, max_tokens=300,
                                               tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=False)
        for choice in reply.choices:
            assert choice.finish_reason == "tool_calls", choice.message
            (call,) = choice.message.tool_calls
            if isinstance(tool_choice, dict):
                assert call.function.name == "add"
            (tool,) = [t for t in TOOLS if t["function"]["name"] == call.function.name]
            jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


@pytest.mark.parametrize("fields,param,fragment", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}}, "response_format", "objectx"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}}, "response_format",
     "nowhere"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
    ({"tool_choice": "required"}, "tool_choice", "no tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "fly"}}}, "tool_choice", "'fly'"),
])
def test_unenforceable_requests_get_a_400(client, fields, param, fragment):
    response = httpx.post(f"{client.base_url}chat/completions", json={"model": "glm-tiny", "messages": QUESTION, **fields}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and fragment in error["message"], error


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    with scripted_server(tmp_path_factory.mktemp("scripted")) as (_, client, _model_dir):
        yield client


def test_grammars_start_after_the_reasoning(scripted):
    """The scripted model reasons, then calls get_weather: with the call forced, the reasoning is
    untouched and the call is the one it makes freely; with JSON forced instead, the reasoning is
    still untouched (a grammar from the first token would have forbidden it) and the reply parses."""
    tools = [TOOLS[0] | {"function": {**TOOLS[0]["function"], "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = scripted.chat.completions.create(model="glm-scripted", messages=messages, tools=tools, tool_choice="required", temperature=0)
    message = forced.choices[0].message
    assert message.reasoning_content == scripted_model.REASONING
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [("get_weather", {"city": "Paris"})]
    as_json = scripted.chat.completions.create(model="glm-scripted", messages=messages, temperature=0, max_tokens=200,
                                               response_format={"type": "json_object"})
    assert as_json.choices[0].message.reasoning_content == scripted_model.REASONING
    assert isinstance(json.loads(as_json.choices[0].message.content), dict)
