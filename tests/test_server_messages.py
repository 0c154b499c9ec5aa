"""Anthropic's Messages API (POST /v1/messages), as Claude Code and the Anthropic SDKs use it: on the
scripted model (tests/scripted_model.py) a thinking block and a tool_use block come back with
stop_reason tool_use, and the second turn that sends them back with the tool's result renders the
prompt the chat route renders for the same conversation; streamed events build the same message;
on the random fixture the text is the chat route's, stop sequences and max_tokens end it as
Anthropic says, count_tokens counts what a request reports, and bad requests get a 400 naming the
field in a body Anthropic's clients read."""
from __future__ import annotations

import json
import re
import time

import httpx
import pytest
import scripted_model
from glm_fixtures import checkpoint_dir
from server_process import scripted_server, served_with_client

TOOLS = [{"name": "get_weather", "description": "Current weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                                "parameters": TOOLS[0]["input_schema"]}}]
QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    with scripted_server(tmp_path_factory.mktemp("scripted")) as (base, client, _):
        yield base, client


@pytest.fixture(scope="module")
def tiny():
    with served_with_client("--model", str(checkpoint_dir("3.0")), "--model-name", "glm-tiny", timeout=120) as served:
        yield served


def post(base: str, body: dict, path: str = "/v1/messages") -> httpx.Response:
    return httpx.post(f"{base}{path}", json=body, headers={"anthropic-version": "2023-06-01"}, timeout=60)


def prompt_tokens(usage: dict) -> int:
    """Anthropic counts the prompt's cached tokens apart from input_tokens."""
    return usage["input_tokens"] + usage["cache_read_input_tokens"]


def message(base: str, **body) -> dict:
    reply = post(base, body)
    assert reply.status_code == 200, reply.text
    out = reply.json()
    assert out["type"] == "message" and out["role"] == "assistant" and out["id"].startswith("msg_")
    assert set(out["usage"]) >= {"input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"}
    return out


def streamed(base: str, **body) -> tuple[list[str], list[dict]]:
    with httpx.stream("POST", f"{base}/v1/messages", json=body | {"stream": True}, timeout=60) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in reply.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert names == [e["type"] for e in events]
    return names, events


def rebuilt(events: list[dict]) -> dict:
    """The message a client builds from the events, as the Anthropic SDK's accumulator does."""
    out = dict(events[0]["message"])
    out["content"] = [dict(b) for b in out["content"]]
    partial: dict[int, str] = {}
    for event in events[1:]:
        if event["type"] == "content_block_start":
            out["content"].append(dict(event["content_block"]))
        elif event["type"] == "content_block_delta":
            block, delta = out["content"][event["index"]], event["delta"]
            if delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
            else:
                kind = delta["type"].removesuffix("_delta")
                block[kind] += delta[kind]
        elif event["type"] == "content_block_stop" and event["index"] in partial:
            out["content"][event["index"]]["input"] = json.loads(partial[event["index"]])
        elif event["type"] == "message_delta":
            out |= event["delta"]
            out["usage"] = out["usage"] | event["usage"]
    return out


def test_a_tool_use_round_trip(scripted):
    base, client = scripted
    first = message(base, model="glm-scripted", max_tokens=200, messages=[{"role": "user", "content": QUESTION}], tools=TOOLS,
                    temperature=0)
    thinking, call = first["content"]
    assert thinking == {"type": "thinking", "thinking": scripted_model.REASONING, "signature": ""}
    assert call["type"] == "tool_use" and call["name"] == "get_weather" and call["input"] == {"city": "Paris"}
    assert first["stop_reason"] == "tool_use" and first["stop_sequence"] is None
    chat = client.chat.completions.create(model="glm-scripted", messages=[{"role": "user", "content": QUESTION}], tools=CHAT_TOOLS,
                                          temperature=0)
    assert prompt_tokens(first["usage"]) == chat.usage.prompt_tokens
    assert first["usage"]["output_tokens"] == chat.usage.completion_tokens

    # The second turn as Claude Code sends it: the assistant's blocks echoed back, the tool's result
    # in a user turn, a system prompt as text blocks with cache_control, and fields that cannot
    # change the output here.
    history = [{"role": "user", "content": [{"type": "text", "text": QUESTION}]},
               {"role": "assistant", "content": first["content"]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "Sunny, 21 degrees"}]}]
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    second = message(base, model="glm-scripted", max_tokens=200, system=system, messages=history, tools=TOOLS, temperature=0,
                     tool_choice={"type": "auto"}, metadata={"user_id": "u-1"}, thinking={"type": "enabled", "budget_tokens": 1024})
    chat_history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION},
                    {"role": "assistant", "content": None, "reasoning_content": scripted_model.REASONING,
                     "tool_calls": [{"id": call["id"], "type": "function",
                                     "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
                    {"role": "tool", "tool_call_id": call["id"], "content": "Sunny, 21 degrees"}]
    chat_second = client.chat.completions.create(model="glm-scripted", messages=chat_history, tools=CHAT_TOOLS, temperature=0)
    assert prompt_tokens(second["usage"]) == chat_second.usage.prompt_tokens
    assert second["usage"]["cache_read_input_tokens"] > 0  # the first turn's pages
    counted = post(base, {"model": "glm-scripted", "system": system, "messages": history, "tools": TOOLS}, "/v1/messages/count_tokens")
    assert counted.json() == {"input_tokens": chat_second.usage.prompt_tokens}
    assert [block["type"] for block in second["content"]] == ["thinking", "tool_use"]


def test_streamed_events_build_the_plain_message(scripted):
    base, _ = scripted
    body = {"model": "glm-scripted", "max_tokens": 200, "messages": [{"role": "user", "content": QUESTION}], "tools": TOOLS,
            "temperature": 0}
    plain = message(base, **body)
    names, events = streamed(base, **body)
    assert names == ["message_start", "ping",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    assert events[0]["message"]["content"] == [] and events[0]["message"]["stop_reason"] is None
    final = rebuilt(events)

    def without_ids(content):
        return [{k: v for k, v in block.items() if k != "id"} for block in content]

    assert without_ids(final["content"]) == without_ids(plain["content"])
    assert final["stop_reason"] == "tool_use" and final["usage"] == plain["usage"]


def test_text_stop_sequences_and_max_tokens(tiny):
    base, client = tiny
    messages = [{"role": "user", "content": "Write a line about the sea."}]
    chat = client.chat.completions.create(model="glm-tiny", messages=[{"role": "system", "content": "Be brief."}] + messages,
                                          max_tokens=24, temperature=0)
    text = chat.choices[0].message.content
    assert len(text.strip()) >= 5  # the random model's greedy line, which the stop sequence below cuts
    body = {"model": "glm-tiny", "system": "Be brief.", "messages": messages, "temperature": 0}
    whole = message(base, max_tokens=24, **body)
    assert whole["content"] == [{"type": "text", "text": text}] and whole["stop_sequence"] is None
    assert whole["stop_reason"] == {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason]
    assert prompt_tokens(whole["usage"]) == chat.usage.prompt_tokens and whole["usage"]["output_tokens"] == chat.usage.completion_tokens
    stop = text.strip()[2:5]
    stopped = message(base, max_tokens=24, stop_sequences=[stop, "never in it \u2603"], **body)
    assert stopped["stop_reason"] == "stop_sequence" and stopped["stop_sequence"] == stop
    assert stopped["content"] == [{"type": "text", "text": text[:text.index(stop)]}]
    names, events = streamed(base, max_tokens=24, stop_sequences=[stop], **body)
    assert rebuilt(events)["content"] == stopped["content"] and rebuilt(events)["stop_sequence"] == stop
    assert names[-2:] == ["message_delta", "message_stop"]
    counted = post(base, body, "/v1/messages/count_tokens").json()  # no max_tokens: Anthropic's count takes none
    assert counted == {"input_tokens": prompt_tokens(whole["usage"])}
    thinking_off = message(base, max_tokens=4, thinking={"type": "disabled"}, **body)
    assert thinking_off["usage"]["output_tokens"] == 4


@pytest.mark.parametrize("body,status,param", [
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "max_tokens"),
    ({"max_tokens": 4, "messages": []}, 400, "messages"),
    ({"max_tokens": 4, "messages": [{"role": "system", "content": "hi"}]}, 400, "messages.0.role"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "AA=="}}]}]},
     400, "messages.0.content.0"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     400, "tools.0.type"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "f"}]}, 400, "tools.0"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "sometimes"}}, 400, "tool_choice"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, 400, "messages.0.content.0.tool_use_id"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "temperature": 3}, 400, "temperature"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "mcp_servers": [{"url": "x"}]}, 400, "mcp_servers"),
    ({"model": "claude-sonnet-4-5", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
])
def test_bad_requests_say_why_in_anthropics_shape(tiny, body, status, param):
    base, _ = tiny
    reply = post(base, {"model": "glm-tiny", **body})
    assert reply.status_code == status, reply.text
    error = reply.json()
    assert error["type"] == "error" and error["error"]["param"] == param and error["error"]["message"]
    assert error["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    malformed = httpx.post(f"{base}/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
    assert malformed.status_code == 400 and malformed.json()["type"] == "error"


def test_a_client_that_leaves_a_stream_cancels_its_sequence(tiny):
    """EOS ignored (vLLM's extension) and 4000 tokens allowed: the sequence would run for seconds;
    the client leaves after the first text and within a few steps nothing runs and no page is held."""
    base, _ = tiny

    def metric(name: str) -> float:
        found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", httpx.get(f"{base}/metrics").text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    cancelled = metric('trellisforge_requests_total{outcome="cancelled"}')
    body = {"model": "glm-tiny", "max_tokens": 4000, "messages": [{"role": "user", "content": "Once"}], "temperature": 1.0,
            "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{base}/v1/messages", json=body, timeout=60) as reply:
        for line in reply.iter_lines():
            if "text_delta" in line:
                break
    for _ in range(150):
        if metric("trellisforge_requests_running") == 0 and metric("trellisforge_kv_pages_used") == 0:
            break
        time.sleep(0.02)
    assert metric("trellisforge_requests_running") == 0 and metric("trellisforge_kv_pages_used") == 0
    assert metric('trellisforge_requests_total{outcome="cancelled"}') == cancelled + 1
