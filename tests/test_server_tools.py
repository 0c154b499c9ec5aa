"""Reasoning and tool calls end to end, on the scripted model (tests/scripted_model.py), whose
greedy output is `<think>`-reasoning, then a GLM-4.7-style call of get_weather(city="Paris")."""
from __future__ import annotations

import json

import pytest
import scripted_model
from server_process import scripted_server, served_with_client

from trellisforge.tokenizer import Tokenizer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    with scripted_server(tmp_path_factory.mktemp("scripted")) as (_, client, model_dir):
        yield client, Tokenizer(model_dir)


def test_tool_call_round_trip(scripted):
    client, tokenizer = scripted
    first = client.chat.completions.create(model="glm-scripted", messages=QUESTION, tools=TOOLS, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.reasoning_content == scripted_model.REASONING
    assert not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    history = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees"},
    ]
    second = client.chat.completions.create(model="glm-scripted", messages=history, tools=TOOLS, temperature=0)
    as_template_sees_it = [dict(m) for m in history]  # the server parses arguments into objects
    as_template_sees_it[1] = {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    rendered = tokenizer.render_chat(as_template_sees_it, tools=TOOLS)
    assert "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>" in rendered
    assert "<|observation|><tool_response>Sunny, 21 degrees</tool_response><|assistant|><think>" in rendered
    assert second.usage.prompt_tokens == len(tokenizer.encode(rendered))
    assert second.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_streamed_reasoning_and_tool_call(scripted):
    client, _ = scripted
    chunks = list(client.chat.completions.create(model="glm-scripted", messages=QUESTION, tools=TOOLS, temperature=0, stream=True))
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [call for c in chunks if c.choices for call in (c.choices[0].delta.tool_calls or [])]
    assert reasoning == scripted_model.REASONING and content == ""
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_without_tools_the_call_stays_text(scripted):
    client, _ = scripted
    reply = client.chat.completions.create(model="glm-scripted", messages=QUESTION, temperature=0)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "stop" and not message.tool_calls
    assert message.reasoning_content == scripted_model.REASONING
    assert message.content.startswith("<tool_call>get_weather")


@pytest.fixture(scope="module")
def repeating(tmp_path_factory):
    model_dir = scripted_model.write(tmp_path_factory.mktemp("repeating") / "glm-repeating", repeat_calls=True)
    with served_with_client("--model", str(model_dir)) as (_, client):
        yield client


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_ends_a_choice_at_its_first_call(repeating, stream):
    """A model that would call get_weather over and over: parallel calls come back while allowed, and
    with parallel_tool_calls false the first call ends the choice (finish_reason tool_calls)."""
    def calls(**fields):
        reply = repeating.chat.completions.create(model="glm-repeating", messages=QUESTION, tools=TOOLS, temperature=0,
                                                  max_tokens=60, stream=stream, **fields)
        if not stream:
            return reply.choices[0].message.tool_calls or [], reply.choices[0].finish_reason
        chunks = [c for c in reply if c.choices]
        return [call for c in chunks for call in (c.choices[0].delta.tool_calls or [])], chunks[-1].choices[0].finish_reason

    many, _ = calls()
    assert len(many) >= 2 and {c.function.name for c in many} == {"get_weather"}
    (one,), finish = calls(parallel_tool_calls=False)
    assert finish == "tool_calls" and json.loads(one.function.arguments) == {"city": "Paris"}
