"""OpenAI API details a client relies on: special tokens never reach the text, a list of prompts gets
a choice per prompt, newer clients' hint fields are taken, and clear 4xx errors for top_logprobs
without logprobs, a body that is not declared JSON, token ids past the vocabulary, too many stop
strings and the deprecated `functions`."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from glm_fixtures import checkpoint_dir
from server_process import running_server

from trellisforge.tokenizer import Tokenizer

MESSAGES = [{"role": "user", "content": "Write something."}]


@pytest.fixture(scope="module")
def server():
    with running_server("--model", str(checkpoint_dir("3.0")), "--model-name", "glm-tiny", "--max-seqs", "16") as (base, _):
        yield base, openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120)


def test_special_tokens_never_reach_the_text(server):
    """The random model samples GLM's special tokens now and then ([gMASK], <sop>, ...; EOS is
    ignored here so it keeps going): the logprobs show them, the text never does."""
    _, client = server
    specials = [Tokenizer(checkpoint_dir("3.0")).decode([t]) for t in sorted(Tokenizer(checkpoint_dir("3.0")).special_ids)]
    sampled = 0
    for seed in range(3):
        chat = client.chat.completions.create(model="glm-tiny", messages=MESSAGES, n=4, max_tokens=160, temperature=1.5, seed=seed,
                                              logprobs=True, extra_body={"ignore_eos": True})
        for choice in chat.choices:
            tokens = [entry.token for entry in choice.logprobs.content]
            sampled += sum(token in specials for token in tokens)
            assert not any(s in choice.message.content for s in specials), choice.message.content
        text = client.completions.create(model="glm-tiny", prompt="Once", n=4, max_tokens=160, temperature=1.5, seed=seed, logprobs=1,
                                         extra_body={"ignore_eos": True})
        for choice in text.choices:
            sampled += sum(token in specials for token in choice.logprobs.tokens)
            assert not any(s in choice.text for s in specials), choice.text
    assert sampled > 0, "no special token was sampled: the check above proved nothing"
    kept = client.completions.create(model="glm-tiny", prompt="Once", n=4, max_tokens=160, temperature=1.5, seed=0, logprobs=1,
                                     extra_body={"ignore_eos": True, "skip_special_tokens": False})
    assert any(s in choice.text for choice in kept.choices for s in specials)


def test_a_list_of_prompts_gets_a_choice_per_prompt(server):
    _, client = server
    prompts = ["The history of", "Once upon a time", "In the beginning"]
    alone = [client.completions.create(model="glm-tiny", prompt=p, max_tokens=6, temperature=0).choices[0].text for p in prompts]
    together = client.completions.create(model="glm-tiny", prompt=prompts, max_tokens=6, temperature=0, n=2)
    assert [c.index for c in together.choices] == list(range(6))
    assert [c.text for c in together.choices] == [text for text in alone for _ in range(2)]
    single = client.completions.create(model="glm-tiny", prompt=prompts[0], max_tokens=6, temperature=0)
    as_ids = client.completions.create(model="glm-tiny", prompt=[[5, 6, 7], [8, 9, 10, 11]], max_tokens=6, temperature=0)
    assert as_ids.usage.prompt_tokens == 7 and len(as_ids.choices) == 2
    assert together.usage.prompt_tokens == sum(
        client.completions.create(model="glm-tiny", prompt=p, max_tokens=1).usage.prompt_tokens for p in prompts)
    assert single.choices[0].text == alone[0]


@pytest.mark.parametrize("endpoint,body,status,param,code", [
    ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 3}, 400, "top_logprobs", "invalid_value"),
    ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 3, "logprobs": False}, 400, "top_logprobs", "invalid_value"),
    ("/v1/completions", {"prompt": [5, 2048]}, 400, "prompt", "token_out_of_vocabulary"),
    ("/v1/completions", {"prompt": [[5], [6, 99999]]}, 400, "prompt.1", "token_out_of_vocabulary"),
    ("/v1/completions", {"prompt": ["a", [5]]}, 400, "prompt", "invalid_value"),
    ("/v1/completions", {"prompt": ["a"] * 17}, 400, "prompt", "invalid_value"),
    ("/v1/completions", {"prompt": "a", "stop": [str(i) for i in range(17)]}, 400, "stop", "invalid_value"),
    # Image and video parts: refused by name (a text model serves here), whatever else the message holds.
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]},
     400, "messages.0.content.1", "unsupported_content"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}}]}]}, 400, "messages.1.content.0", "unsupported_content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400, "messages.0.content.0.text",
     None),
    ("/v1/chat/completions", {"messages": MESSAGES, "modalities": ["text", "audio"]}, 400, "modalities.1", "invalid_value"),
    ("/v1/chat/completions", {"messages": MESSAGES, "functions": [{"name": "f", "parameters": {}}]}, 400, None, "invalid_value"),
    ("/v1/chat/completions", {"messages": MESSAGES, "function_call": "auto"}, 400, None, "invalid_value"),
    ("/v1/chat/completions", {"messages": MESSAGES, "stream_options": {"include_usage": True, "include_obfuscations": True}}, 400,
     "stream_options.include_obfuscations", "invalid_value"),
])
def test_clear_client_errors(server, endpoint, body, status, param, code):
    base, _ = server
    response = httpx.post(f"{base}{endpoint}", json={"model": "glm-tiny", "max_tokens": 2, **body}, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == code and error["message"], error


def test_fields_that_cannot_change_the_output_are_taken(server):
    """What newer OpenAI clients send beside the parameters (routing, caching and safety hints, the
    stream's obfuscation switch, a predicted output): accepted, and the answer is the one without them."""
    _, client = server
    plain = client.chat.completions.create(model="glm-tiny", messages=MESSAGES, max_tokens=6, temperature=0)
    hinted = client.chat.completions.create(model="glm-tiny", messages=MESSAGES, max_tokens=6, temperature=0, service_tier="auto",
                                            prompt_cache_key="session-1", safety_identifier="user-1", modalities=["text"],
                                            prediction={"type": "content", "content": "Something."})
    assert hinted.choices[0].message.content == plain.choices[0].message.content
    streamed = client.chat.completions.create(model="glm-tiny", messages=MESSAGES, max_tokens=6, temperature=0, stream=True,
                                              stream_options={"include_usage": True, "include_obfuscation": False})
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == plain.choices[0].message.content
    legacy = httpx.post(f"{client.base_url}chat/completions", json={"model": "glm-tiny", "messages": MESSAGES, "functions": []})
    assert "send 'tools'" in legacy.json()["error"]["message"]


def test_sixteen_stop_strings_are_taken(server):
    base, _ = server
    response = httpx.post(f"{base}/v1/completions", json={"model": "glm-tiny", "prompt": "a", "max_tokens": 2,
                                                          "stop": [f"zz{i}" for i in range(16)]})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("headers", [{}, {"content-type": "application/x-www-form-urlencoded"}, {"content-type": "text/plain"}])
def test_a_body_not_declared_json_gets_a_clear_message(server, headers):
    base, _ = server
    body = json.dumps({"model": "glm-tiny", "prompt": "a", "max_tokens": 2}).encode()
    response = httpx.post(f"{base}/v1/completions", content=body, headers=headers)
    assert response.status_code == 415
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type" and "Content-Type: application/json" in error["message"]
    declared = httpx.post(f"{base}/v1/completions", content=body, headers={"content-type": "application/json; charset=utf-8"})
    assert declared.status_code == 200


def test_cancelled_streams_are_counted(server):
    base, _ = server

    def cancelled() -> float:
        for line in httpx.get(f"{base}/metrics").text.splitlines():
            if line.startswith('trellisforge_requests_total{outcome="cancelled"}'):
                return float(line.split()[-1])
        return 0.0

    before = cancelled()
    body = {"model": "glm-tiny", "prompt": "Once", "max_tokens": 500, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                break  # leave after the first chunk
    for _ in range(100):
        if cancelled() == before + 1:
            break
        time.sleep(0.05)
    assert cancelled() == before + 1


def test_reasoning_effort_reaches_the_chat_template(tmp_path):
    """GLM-5.3's templates print the request's reasoning_effort into the prompt: the server hands it
    to the template (chat_template_kwargs win when both name it) and refuses efforts it does not know."""
    source = checkpoint_dir("3.0")
    model = tmp_path / "model"
    model.mkdir()
    for item in source.iterdir():
        (model / item.name).symlink_to(item)
    (model / "chat_template.jinja").unlink()
    (model / "chat_template.jinja").write_text(
        "[gMASK]<sop>{% if reasoning_effort %}<|system|>Reasoning Effort: {{ reasoning_effort }}{% endif %}"
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>")
    tokenizer = Tokenizer(model)

    def expected(effort=None):
        return len(tokenizer.encode_chat(MESSAGES, **({"reasoning_effort": effort} if effort else {})))

    with running_server("--model", str(model), "--model-name", "glm-tiny") as (base, _):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120)
        plain = client.chat.completions.create(model="glm-tiny", messages=MESSAGES, max_tokens=1)
        low = client.chat.completions.create(model="glm-tiny", messages=MESSAGES, max_tokens=1, reasoning_effort="low")
        maximal = client.chat.completions.create(model="glm-tiny", messages=MESSAGES, max_tokens=1,
                                                 extra_body={"reasoning_effort": "max", "chat_template_kwargs": {"reasoning_effort": "Max"}})
        assert plain.usage.prompt_tokens == expected() < low.usage.prompt_tokens == expected("low")
        assert maximal.usage.prompt_tokens == expected("Max")
        refused = httpx.post(f"{base}/v1/chat/completions", json={"model": "glm-tiny", "messages": MESSAGES, "reasoning_effort": "huge"}, timeout=30)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "reasoning_effort"


def test_a_repeated_system_prompt_is_served_from_the_prefix_cache(server):
    """Two chats sharing a long system prompt: the second reports the shared full KV pages as
    usage.prompt_tokens_details.cached_tokens, /metrics counts them, and its answer equals what a
    server without the cache gives."""
    base, client = server
    system = {"role": "system", "content": "You are a careful assistant. " * 12}
    first = [system, {"role": "user", "content": "Name a colour."}]
    second = [system, {"role": "user", "content": "Name a number."}]
    one = client.chat.completions.create(model="glm-tiny", messages=first, max_tokens=8, temperature=0)
    two = client.chat.completions.create(model="glm-tiny", messages=second, max_tokens=8, temperature=0)
    assert one.usage.prompt_tokens_details.cached_tokens == 0
    cached = two.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 16 == 0 and cached < two.usage.prompt_tokens
    streamed = client.chat.completions.create(model="glm-tiny", messages=second, max_tokens=8, temperature=0, stream=True,
                                              stream_options={"include_usage": True})
    chunks = list(streamed)
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == (two.usage.prompt_tokens - 1) // 16 * 16
    metrics = httpx.get(f"{base}/metrics").text
    hits = next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("trellisforge_prefix_cache_hit_tokens "))
    assert hits >= cached
    with running_server("--model", str(checkpoint_dir("3.0")), "--model-name", "glm-tiny", "--no-prefix-cache") as (other, _):
        plain = openai.OpenAI(base_url=f"{other}/v1", api_key="x", max_retries=0, timeout=120)
        plain.chat.completions.create(model="glm-tiny", messages=first, max_tokens=8, temperature=0)
        again = plain.chat.completions.create(model="glm-tiny", messages=second, max_tokens=8, temperature=0)
        assert again.usage.prompt_tokens_details.cached_tokens == 0
        assert again.choices[0].message.content == two.choices[0].message.content


def prefix_hits(base: str) -> float:
    metrics = httpx.get(f"{base}/metrics").text
    return next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("trellisforge_prefix_cache_hit_tokens "))


def test_the_choices_of_one_prompt_compute_it_once(server):
    """n = 3 on a prompt of several 256-row chunks: the second and third choices wait for the first
    one's prompt and map all its full KV pages from the prefix cache (two choices' worth of hits in
    /metrics; added while it ran, they mapped only the chunks done by then and computed the rest beside
    it), and each choice is what a lone request with its seed gives."""
    base, client = server
    prompt = "Every choice of this request shares the same prompt, word for word. " * 60
    sampling = {"max_tokens": 10, "temperature": 1.0, "logprobs": 1, "extra_body": {"ignore_eos": True}}
    before = prefix_hits(base)
    together = client.completions.create(model="glm-tiny", prompt=prompt, n=3, seed=40, **sampling)
    length = together.usage.prompt_tokens
    assert length > 4 * 256 and together.usage.prompt_tokens_details.cached_tokens == 0
    assert prefix_hits(base) - before == 2 * ((length - 1) // 16 * 16)
    for j, choice in enumerate(together.choices):
        alone = client.completions.create(model="glm-tiny", prompt=prompt, seed=40 + j, **sampling).choices[0]
        assert (choice.text, choice.logprobs.token_logprobs) == (alone.text, alone.logprobs.token_logprobs)
    streamed = client.chat.completions.create(model="glm-tiny", messages=[{"role": "user", "content": prompt}], n=2, max_tokens=6,
                                              temperature=0, stream=True)
    texts = ["", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts[0] == texts[1]


def test_requests_sharing_a_long_prefix_compute_it_once(server):
    """Two requests at once over one long shared start (an agent's parallel calls with the same
    system prompt; several 256-row chunks): the later waits for the earlier's prompt and maps every
    full page they share from the prefix cache, where added beside it, it mapped only the chunks
    done by then and computed the rest in the same steps. Each answer is the lone request's."""
    base, client = server
    shared = "An agent's long instructions, the same for every call it makes in parallel. " * 60
    prompts = [shared + "First, list the files.", shared + "Second, read the longest one and say what it does."]
    tokens = [Tokenizer(checkpoint_dir("3.0")).encode(p) for p in prompts]
    common = next(i for i, (a, b) in enumerate(zip(*tokens)) if a != b)
    assert common > 4 * 256
    sampling = {"max_tokens": 8, "temperature": 0, "extra_body": {"ignore_eos": True}}
    before = prefix_hits(base)
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda p: client.completions.create(model="glm-tiny", prompt=p, **sampling), prompts))
    cached = sorted(r.usage.prompt_tokens_details.cached_tokens for r in together)
    assert cached == [0, common // 16 * 16]
    assert prefix_hits(base) - before == common // 16 * 16
    for prompt, response in zip(prompts, together):
        assert response.choices[0].text == client.completions.create(model="glm-tiny", prompt=prompt, **sampling).choices[0].text

