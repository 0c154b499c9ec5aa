"""The OpenAI Responses API (POST /v1/responses), as Codex CLI and the Agents SDK use it: on the
scripted model (tests/scripted_model.py) a reasoning item and a function call come back, and a
second turn that sends them with the call's output renders exactly the prompt the chat route renders
for the same conversation, and so does one that names the stored first turn by previous_response_id
(the store's reads, deletes and bound are tested too); streamed events build the same response, in order, each one of the SDK's
event types; on the random fixture the text is the chat route's, structured output holds, and bad
requests get a 400 naming the field."""
from __future__ import annotations

import json
import time

import httpx
import jsonschema
import pydantic
import pytest
import scripted_model
from glm_fixtures import checkpoint_dir
from server_process import running_server, scripted_server, served_with_client

from openai.types.responses import Response, ResponseStreamEvent

TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}]
QUESTION = "What is the weather in Paris?"
EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    with scripted_server(tmp_path_factory.mktemp("scripted")) as (base, client, _):
        yield base, client


@pytest.fixture(scope="module")
def tiny():
    with served_with_client("--model", str(checkpoint_dir("3.0")), "--model-name", "glm-tiny", timeout=120) as served:
        yield served


def create(base: str, **body) -> dict:
    """A plain request's response, checked against the SDK's Response model field by field."""
    reply = httpx.post(f"{base}/v1/responses", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    Response.model_validate(reply.json())
    return reply.json()


def test_a_tool_call_round_trip(scripted):
    base, client = scripted
    first = create(base, model="glm-scripted", input=QUESTION, tools=TOOLS, temperature=0)
    assert first["status"] == "completed" and first["object"] == "response"
    reasoning, call = first["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [{"type": "reasoning_text", "text": scripted_model.REASONING}]
    assert call["type"] == "function_call" and call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    chat = client.chat.completions.create(model="glm-scripted", messages=[{"role": "user", "content": QUESTION}], tools=CHAT_TOOLS,
                                          temperature=0)
    assert first["usage"]["input_tokens"] == chat.usage.prompt_tokens
    assert first["usage"]["output_tokens"] == chat.usage.completion_tokens
    assert 0 < first["usage"]["output_tokens_details"]["reasoning_tokens"] < first["usage"]["output_tokens"]

    # The second turn as Codex sends it: the whole conversation, the model's items echoed back.
    second_input = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
                    reasoning, call, {"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny, 21 degrees"}]
    # ... with the fields it sends beside them, which cannot change the output here.
    second = create(base, model="glm-scripted", input=second_input, tools=TOOLS, temperature=0, instructions="Be brief.",
                    tool_choice="auto", parallel_tool_calls=False, reasoning={"effort": "medium", "summary": "auto"}, store=False,
                    include=["reasoning.encrypted_content"], prompt_cache_key="thread-1", text={"verbosity": "medium"})
    chat_call = chat.choices[0].message.tool_calls[0]
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION},
               {"role": "assistant", "content": None, "reasoning_content": scripted_model.REASONING,
                "tool_calls": [chat_call.model_dump() | {"id": call["call_id"]}]},
               {"role": "tool", "tool_call_id": call["call_id"], "content": "Sunny, 21 degrees"}]
    chat_second = client.chat.completions.create(model="glm-scripted", messages=history, tools=CHAT_TOOLS, temperature=0)
    assert second["usage"]["input_tokens"] == chat_second.usage.prompt_tokens
    assert [item["type"] for item in second["output"]] == ["reasoning", "function_call"]


def test_streamed_events_build_the_plain_response(scripted):
    base, _ = scripted
    plain = create(base, model="glm-scripted", input=QUESTION, tools=TOOLS, temperature=0)
    with httpx.stream("POST", f"{base}/v1/responses", json={"model": "glm-scripted", "input": QUESTION, "tools": TOOLS,
                                                             "temperature": 0, "stream": True}, timeout=60) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in reply.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert names == [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        EVENTS.validate_python(event)
    assert names == ["response.created", "response.in_progress",
                     "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                     "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
                     "response.output_item.added", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    final = events[-1]["response"]

    def without_ids(output):
        return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in output]

    assert without_ids(final["output"]) == without_ids(plain["output"])
    assert final["usage"] == plain["usage"] and final["status"] == "completed"
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == final["output"]


def test_the_text_is_the_chat_routes_and_an_early_end_is_incomplete(tiny):
    base, client = tiny
    reply = create(base, model="glm-tiny", input=[{"role": "user", "content": "Name a colour."}], instructions="Be brief.",
                   max_output_tokens=8, temperature=0)
    chat = client.chat.completions.create(model="glm-tiny", messages=[{"role": "system", "content": "Be brief."},
                                                                      {"role": "user", "content": "Name a colour."}],
                                          max_tokens=8, temperature=0)
    (message,) = reply["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == chat.choices[0].message.content
    assert reply["usage"]["input_tokens"] == chat.usage.prompt_tokens
    if chat.choices[0].finish_reason == "length":
        assert reply["status"] == "incomplete" and reply["incomplete_details"] == {"reason": "max_output_tokens"}
    streamed = client.responses.create(model="glm-tiny", input=[{"role": "user", "content": "Name a colour."}],
                                       instructions="Be brief.", max_output_tokens=8, temperature=0, stream=True)
    text = "".join(e.delta for e in streamed if e.type == "response.output_text.delta")
    assert text == chat.choices[0].message.content


def test_a_json_schema_format_is_enforced(tiny):
    base, _ = tiny
    schema = {"type": "object", "properties": {"kind": {"enum": ["town", "city"]}, "size": {"type": "integer", "minimum": 0,
                                                                                          "maximum": 99}},
              "required": ["kind", "size"], "additionalProperties": False}
    for seed in range(3):
        reply = create(base, model="glm-tiny", input="Describe a place.", temperature=1.0, seed=seed, max_output_tokens=200,
                       text={"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}})
        jsonschema.validate(json.loads(reply["output"][-1]["content"][0]["text"]), schema)


@pytest.mark.parametrize("fields,param,code", [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "previous_response_not_found"),
    ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
    ({"background": True}, "background", "unsupported_parameter"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type", "unsupported_value"),
    ({"tools": [{"type": "function", "name": "f", "colour": "red"}]}, "tools.0", None),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]},
     "input.0.content.0", "unsupported_content"),
    ({"input": [{"type": "local_shell_call", "id": "x"}]}, "input.0.type", "unsupported_value"),
    ({"input": [{"role": "user", "content": "hi"}, {"type": "item_reference", "id": "msg_1"}]}, "input.1", "item_not_found"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input.0.call_id", None),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input.0.role", None),
    ({"text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "text.format.name", "invalid_value"),
    ({"tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice", "unsupported_value"),
    ({"truncation": "auto"}, "truncation", "invalid_value"),
    ({"temprature": 0.5}, "temprature", "invalid_value"),
    ({"max_output_tokens": 100_000}, "max_output_tokens", "context_length_exceeded"),
    ({"input": "word " * 5000}, "input", "context_length_exceeded"),
])
def test_bad_requests_get_a_400_naming_the_field(tiny, fields, param, code):
    base, _ = tiny
    reply = httpx.post(f"{base}/v1/responses", json={"model": "glm-tiny", "input": "hi", "max_output_tokens": 2, **fields}, timeout=30)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["code"] == code and error["message"], error


def test_a_client_that_leaves_a_stream_leaves_nothing_running(tiny):
    base, _ = tiny
    with httpx.stream("POST", f"{base}/v1/responses", json={"model": "glm-tiny", "input": "Once", "stream": True,
                                                             "max_output_tokens": 400, "temperature": 1.0}, timeout=60) as reply:
        for line in reply.iter_lines():
            if "output_text.delta" in line:
                break
    metrics = ""
    for _ in range(100):
        metrics = httpx.get(f"{base}/metrics").text
        if "trellisforge_requests_running 0.0" in metrics and "trellisforge_kv_pages_used 0.0" in metrics:
            break
        time.sleep(0.05)
    assert "trellisforge_requests_running 0.0" in metrics and "trellisforge_kv_pages_used 0.0" in metrics


def test_a_second_turn_by_previous_response_id_is_the_whole_conversation(scripted):
    """Turn two sent as Codex's whole conversation and as the stored turn one's id plus the call's
    output: the same prompt (input tokens) and output; GET gives the stored object, input_items the
    conversation turn two read; an item_reference to a stored item is that item."""
    base, client = scripted
    first = create(base, model="glm-scripted", input=QUESTION, tools=TOOLS, temperature=0)
    assert first["store"] is True and first["previous_response_id"] is None
    reasoning, call = first["output"]
    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny, 21 degrees"}
    whole = create(base, model="glm-scripted", input=[{"type": "message", "role": "user", "content": QUESTION}, reasoning, call,
                                                      answer], tools=TOOLS, temperature=0, store=False)
    chained = create(base, model="glm-scripted", previous_response_id=first["id"], input=[answer], tools=TOOLS, temperature=0)
    assert chained["previous_response_id"] == first["id"]
    wrong = httpx.post(f"{base}/v1/responses", json={"model": "glm-scripted", "previous_response_id": first["id"],
                                                     "input": [answer, {"role": "robot", "content": "hi"}]}, timeout=30)
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "input.1.role"  # counted in its own input
    assert chained["usage"]["input_tokens"] == whole["usage"]["input_tokens"] > first["usage"]["input_tokens"]
    assert [(i["type"], i.get("content"), i.get("arguments")) for i in chained["output"]] == \
           [(i["type"], i.get("content"), i.get("arguments")) for i in whole["output"]]
    referenced = create(base, model="glm-scripted", input=[{"type": "message", "role": "user", "content": QUESTION},
                                                           {"type": "item_reference", "id": reasoning["id"]},
                                                           {"type": "item_reference", "id": call["id"]}, answer],
                        tools=TOOLS, temperature=0)
    assert referenced["usage"]["input_tokens"] == whole["usage"]["input_tokens"]
    named = client.responses.input_items.list(referenced["id"], order="asc").data
    assert [(item.type, item.id) for item in named[1:3]] == [("reasoning", reasoning["id"]), ("function_call", call["id"])]

    assert httpx.get(f"{base}/v1/responses/{chained['id']}", timeout=30).json() == chained
    assert client.responses.retrieve(first["id"]).output[1].call_id == call["call_id"]
    listed = client.responses.input_items.list(chained["id"], order="asc")
    assert [item.type for item in listed.data] == ["message", "reasoning", "function_call", "function_call_output"]
    assert listed.data[2].id == call["id"] and listed.has_more is False
    newest = httpx.get(f"{base}/v1/responses/{chained['id']}/input_items", params={"limit": 2}, timeout=30).json()
    assert [item["type"] for item in newest["data"]] == ["function_call_output", "function_call"] and newest["has_more"]
    rest = httpx.get(f"{base}/v1/responses/{chained['id']}/input_items", params={"limit": 2, "after": newest["last_id"]},
                     timeout=30).json()
    assert [item["type"] for item in rest["data"]] == ["reasoning", "message"] and not rest["has_more"]

    # Not stored: store false, or deleted; a chain that lost a link is refused, not half-read.
    for gone in (whole["id"], "resp_123"):
        reply = httpx.get(f"{base}/v1/responses/{gone}", timeout=30)
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"
    deleted = httpx.delete(f"{base}/v1/responses/{first['id']}", timeout=30)
    assert deleted.json() == {"id": first["id"], "object": "response.deleted", "deleted": True}
    # The call item is still held by the response that named it, so it may still be named.
    again = create(base, model="glm-scripted", input=[{"type": "message", "role": "user", "content": QUESTION},
                                                      {"type": "item_reference", "id": reasoning["id"]},
                                                      {"type": "item_reference", "id": call["id"]}, answer],
                   tools=TOOLS, temperature=0, store=False)
    assert again["usage"]["input_tokens"] == whole["usage"]["input_tokens"]
    assert httpx.get(f"{base}/v1/responses/{first['id']}", timeout=30).status_code == 404
    assert httpx.delete(f"{base}/v1/responses/{first['id']}", timeout=30).status_code == 404
    orphan = httpx.post(f"{base}/v1/responses", json={"model": "glm-scripted", "previous_response_id": chained["id"],
                                                      "input": "And tomorrow?"}, timeout=30)
    assert orphan.status_code == 400 and orphan.json()["error"]["code"] == "previous_response_not_found"


def test_a_streamed_response_is_stored_as_its_last_event_says(scripted):
    base, _ = scripted
    with httpx.stream("POST", f"{base}/v1/responses", json={"model": "glm-scripted", "input": QUESTION, "tools": TOOLS,
                                                             "temperature": 0, "stream": True}, timeout=60) as reply:
        data = [json.loads(line.removeprefix("data: ")) for line in reply.iter_lines() if line.startswith("data: ")]
    final = data[-1]["response"]
    assert data[-1]["type"] == "response.completed" and final["store"] is True
    assert httpx.get(f"{base}/v1/responses/{final['id']}", timeout=30).json() == final


def test_the_store_keeps_what_fits_and_drops_the_least_recently_used(tmp_path):
    """--responses-store-mb bounds the store: the oldest responses go first (one read keeps its
    own), and 0 keeps none."""
    model_dir = scripted_model.write(tmp_path / "glm-scripted")
    with running_server("--model", str(model_dir), "--responses-store-mb", "0.0058") as (base, _):  # four of ~1.4 KB
        def kept(response_id: str) -> bool:
            return httpx.get(f"{base}/v1/responses/{response_id}", timeout=30).status_code == 200

        ids = [create(base, model="glm-scripted", input=f"Question {i}?", temperature=0)["id"] for i in range(4)]
        assert kept(ids[0])  # read: now the most recently used, and ids[1] the least
        ids.append(create(base, model="glm-scripted", input="Question 4?", temperature=0)["id"])
        assert [kept(i) for i in ids] == [True, False, True, True, True]
    with running_server("--model", str(model_dir), "--responses-store-mb", "0") as (base, _):
        reply = create(base, model="glm-scripted", input=QUESTION, temperature=0)
        assert reply["store"] is False and httpx.get(f"{base}/v1/responses/{reply['id']}", timeout=30).status_code == 404
