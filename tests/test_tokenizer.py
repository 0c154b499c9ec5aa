"""Tokenizer, chat template, incremental detokenization and stop strings on the fixture's
tokenizer.json and chat template (the peer rendered its `chat` prompt with the same template)."""
from __future__ import annotations

import pytest
from glm_fixtures import checkpoint_dir, prompts
from hypothesis import given, settings
from hypothesis import strategies as st

from trellisforge.tokenizer import StopMatcher, TemplateError, Tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(checkpoint_dir("3.0"))


def test_chat_template_reproduces_the_peers_chat_prompt(tokenizer):
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France, and why is it famous?"},
    ]
    assert tokenizer.encode_chat(messages) == prompts()["chat"]
    text = tokenizer.render_chat(messages)
    assert text.startswith("[gMASK]<sop><|system|>\n") and text.endswith("<|assistant|>\n")
    assert not tokenizer.render_chat(messages, add_generation_prompt=False).endswith("<|assistant|>\n")


def test_special_tokens_are_atomic_and_text_round_trips(tokenizer):
    assert tokenizer.encode("[gMASK]<sop>") == [tokenizer.token_id("[gMASK]"), tokenizer.token_id("<sop>")]
    for name in ("short", "long"):
        ids = prompts()[name]
        assert tokenizer.encode(tokenizer.decode(ids)) == ids


def test_streaming_never_splits_a_character(tokenizer):
    text = "北京是中国的首都。Café, naïve — ✓ 😀 done"
    ids = tokenizer.encode(text)
    assert len(ids) > len(text) / 2  # multi-byte characters span several byte-level tokens here
    detokenizer = tokenizer.detokenizer()
    deltas = [detokenizer.add(i) for i in ids] + [detokenizer.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text
    assert any(d == "" for d in deltas[:-1])  # some tokens ended mid-character and were held


@pytest.mark.parametrize("chunks,stops,emitted", [
    (["The cap", "ita", "l of F", "rance"], ["capital"], "The "),
    (["a<", "/th", "ink>b"], ["</think>"], "a"),
    (["no stop", " here"], ["zzz"], "no stop here"),
    (["x", "y"], ["yz"], "xy"),
])
def test_stop_strings_across_deltas(chunks, stops, emitted):
    matcher = StopMatcher(stops)
    out = ""
    stopped = False
    for chunk in chunks:
        text, stopped = matcher.feed(chunk)
        out += text
        if stopped:
            break
    if not stopped:
        out += matcher.flush()
    assert out == emitted


def test_template_errors_are_reported(tmp_path, tokenizer):
    (tmp_path / "tokenizer.json").write_bytes((checkpoint_dir("3.0") / "tokenizer.json").read_bytes())
    (tmp_path / "chat_template.jinja").write_text("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(TemplateError, match="roles must alternate"):
        Tokenizer(tmp_path).render_chat([{"role": "user", "content": "hi"}])
    (tmp_path / "chat_template.jinja").write_text("{{ messages.__class__.__mro__ }}")
    with pytest.raises(TemplateError):
        Tokenizer(tmp_path).render_chat([{"role": "user", "content": "hi"}])


@settings(max_examples=300, deadline=None, derandomize=True)
@given(text=st.lists(st.sampled_from(["the ", "  ", "\n", "é", "漢字", "🌊", "[gMASK]", "<|user|>", "aaaaaaa", "-" * 9, "0123", "x"]),
                     max_size=80).map("".join))
def test_the_token_count_bound_never_exceeds_the_count(text):
    """What lets the server refuse a prompt untokenized must be a true lower bound."""
    tokenizer = Tokenizer(checkpoint_dir("3.0"))
    assert tokenizer.max_token_bytes == 19  # the longest piece of the fixture's vocabulary
    assert tokenizer.tokens_at_least(text) <= len(tokenizer.encode(text))
