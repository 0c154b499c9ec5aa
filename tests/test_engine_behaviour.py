"""Engine behaviour on the 3.0 bpw fixture: batch invariance bit for bit, chunked prefill, KV pages
returned on finish and cancel, the pool running out, seeds, and clear errors for bad requests."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from glm_fixtures import checkpoint_dir, prompts

import trellisforge
from trellisforge import Sampling, TrellisError


@pytest.fixture(scope="module")
def model_dir():
    return checkpoint_dir("3.0")


def all_pages_free(engine) -> bool:
    stats = engine.stats()
    return stats["pages_free"] == stats["pages_total"] and stats["pages_reserved"] == 0 and stats["sequences_live"] == 0


def test_logits_alone_equal_logits_batched_bit_for_bit(model_dir):
    p = prompts()
    engine = trellisforge.Engine(model_dir, max_seqs=4, kv_dtype="f32")
    alone = engine.logits(p["short"])
    batched = engine.logits_batch([p["long"], p["short"], p["chat"]])[1]
    assert np.array_equal(alone.view(np.uint32), batched.view(np.uint32))
    assert all_pages_free(engine)


def test_chunked_prefill_equals_one_pass_bit_for_bit(model_dir):
    tokens = prompts()["long"]
    whole = trellisforge.Engine(model_dir, max_seqs=2, rows_max=512, kv_dtype="f32").logits(tokens)
    chunked = trellisforge.Engine(model_dir, max_seqs=2, rows_max=7, page_tokens=5, kv_dtype="f32").logits(tokens)
    assert np.array_equal(whole.view(np.uint32), chunked.view(np.uint32))


def run_together(engine, requests):
    """Adds every (tokens, sampling) request, steps until all finish; returns {id: [events]}."""
    ids = [engine.add(tokens, sampling, stop_token_ids=[]) for tokens, sampling in requests]
    events = {i: [] for i in ids}
    for _ in range(10_000):
        for event in engine.step():
            events[event.sequence_id].append(event)
        if all(e and e[-1].finish_reason for e in events.values()):
            return [events[i] for i in ids]
    raise AssertionError("sequences did not finish")


def test_decode_alone_equals_decode_in_a_batch(model_dir):
    """Tokens and log-probabilities, bit for bit, while other sequences prefill and decode alongside."""
    p = prompts()
    sampling = Sampling(max_tokens=12, temperature=0.8, top_p=0.9, seed=7, top_logprobs=3)
    engine = trellisforge.Engine(model_dir, max_seqs=4, rows_max=40, kv_dtype="f32")
    (alone,) = run_together(engine, [(p["short"], sampling)])
    mixed = run_together(engine, [
        (p["long"], Sampling(max_tokens=5, seed=1, temperature=1.0)),
        (p["short"], sampling),
        (p["chat"], Sampling(max_tokens=20)),
    ])[1]
    assert [e.token for e in alone] == [e.token for e in mixed]
    assert [np.float32(e.logprob).view(np.uint32) for e in alone] == [np.float32(e.logprob).view(np.uint32) for e in mixed]
    assert [e.top for e in alone] == [e.top for e in mixed]
    assert alone[-1].finish_reason == "length" and len(alone) == 12
    assert all_pages_free(engine)


def test_same_seed_same_tokens(model_dir):
    engine = trellisforge.Engine(model_dir, max_seqs=2, kv_dtype="f32")
    tokens = prompts()["random"]
    first = engine.generate(tokens, 16, temperature=1.0, top_k=50, seed=1234)
    again = engine.generate(tokens, 16, temperature=1.0, top_k=50, seed=1234)
    other = engine.generate(tokens, 16, temperature=1.0, top_k=50, seed=4321)
    assert first == again and first != other


def test_stop_tokens_end_a_sequence(model_dir):
    engine = trellisforge.Engine(model_dir, max_seqs=2, kv_dtype="f32")
    tokens = prompts()["short"]
    greedy = engine.generate(tokens, 8, stop_token_ids=[])
    events = list(engine.stream(tokens, 8, stop_token_ids=[greedy[3]]))
    assert [e.token for e in events] == greedy[:greedy.index(greedy[3]) + 1]
    assert events[-1].finish_reason == "stop"
    assert all_pages_free(engine)


def test_cancel_mid_generation_frees_its_pages(model_dir):
    engine = trellisforge.Engine(model_dir, max_seqs=2, page_tokens=4, kv_dtype="f32")
    stream = engine.stream(prompts()["long"], 50, stop_token_ids=[])
    for _ in range(3):
        next(stream)
    assert engine.stats()["pages_free"] < engine.stats()["pages_total"]
    stream.close()  # cancels the sequence
    assert all_pages_free(engine)
    with pytest.raises(TrellisError, match="no live sequence"):
        engine.cancel(12345)


def test_a_full_pool_makes_sequences_wait_without_corruption(model_dir):
    """Two sequences that each grow to 3 of the pool's 4 pages: the second's prompt does not fit
    beside the first's with a page to spare, so it waits for the first, and both produce exactly
    what they produce alone. The context defaults to what the pool holds."""
    p = prompts()
    engine = trellisforge.Engine(model_dir, max_seqs=3, page_tokens=16, kv_pages=4, kv_dtype="f32")
    sampling = Sampling(max_tokens=10)
    alone = [run_together(engine, [(p[name], sampling)])[0] for name in ("chat", "short")]

    waiting = engine.add(p["random"], sampling, stop_token_ids=[])
    engine.cancel(waiting)  # a queued sequence can be cancelled before it runs
    first, second = (engine.add(p[name], sampling, stop_token_ids=[]) for name in ("chat", "short"))
    order = []
    for _ in range(100):
        order += [e for e in engine.step()]
        if engine.stats()["sequences_live"] == 1:
            assert engine.stats()["sequences_waiting"] in (0, 1)
        if sum(1 for e in order if e.finish_reason) == 2:
            break
    tokens = {i: [e.token for e in order if e.sequence_id == i] for i in (first, second)}
    assert tokens[first] == [e.token for e in alone[0]] and tokens[second] == [e.token for e in alone[1]]
    last_of_first = max(i for i, e in enumerate(order) if e.sequence_id == first)
    first_of_second = min(i for i, e in enumerate(order) if e.sequence_id == second)
    assert first_of_second > last_of_first  # it waited for the pages
    assert all_pages_free(engine)
    assert engine.stats()["context_tokens_max"] == 64 and engine.stats()["preemptions"] == 0
    with pytest.raises(TrellisError, match="the prompt has 320 tokens; the context holds 64"):
        engine.add(p["long"], Sampling(max_tokens=32), stop_token_ids=[])
    with pytest.raises(TrellisError, match="context_tokens_max 65 does not fit the KV pool"):
        trellisforge.Engine(model_dir, max_seqs=3, page_tokens=16, kv_pages=4, ctx=65)


def test_a_prompt_longer_than_the_context_is_refused(model_dir):
    engine = trellisforge.Engine(model_dir, max_seqs=2, ctx=64, kv_dtype="f32")
    with pytest.raises(TrellisError, match="the prompt has 320 tokens; the context holds 64") as caught:
        engine.add(prompts()["long"], Sampling(max_tokens=4))
    assert caught.value.status_name == "invalid argument"
    with pytest.raises(TrellisError, match="context holds 64"):
        engine.logits(prompts()["long"])
    assert all_pages_free(engine)


def test_generation_stops_at_the_context(model_dir):
    engine = trellisforge.Engine(model_dir, max_seqs=2, ctx=30, kv_dtype="f32")
    tokens = prompts()["short"]  # 25 tokens
    events = list(engine.stream(tokens, 100, stop_token_ids=[]))
    assert len(events) == 5 and events[-1].finish_reason == "length"


@pytest.mark.parametrize("field,value,message", [
    ("temperature", -1.0, "temperature"),
    ("top_p", 0.0, "top_p"),
    ("top_k", -3, "top_k"),
    ("max_tokens", 0, "max_tokens"),
    ("top_logprobs", 21, "top_logprobs"),
])
def test_bad_sampling_parameters(model_dir, field, value, message):
    engine = trellisforge.Engine(model_dir, max_seqs=1, kv_dtype="f32")
    with pytest.raises(TrellisError, match=message):
        engine.add(prompts()["short"], Sampling(**{field: value}))


def test_bad_tokens_and_empty_prompts(model_dir):
    engine = trellisforge.Engine(model_dir, max_seqs=1, kv_dtype="f32")
    with pytest.raises(TrellisError, match="outside the vocabulary"):
        engine.add([2, 4, 999999], Sampling())
    with pytest.raises(TrellisError, match="empty"):
        engine.add([], Sampling())
    assert all_pages_free(engine)


def copy_with_config(tmp_path, model_dir, edit):
    target = tmp_path / "model"
    shutil.copytree(model_dir, target)
    config = json.loads((target / "config.json").read_text())
    edit(config)
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_config_missing_a_field_is_named(tmp_path, model_dir):
    target = copy_with_config(tmp_path, model_dir, lambda c: c.pop("moe_intermediate_size"))
    with pytest.raises(TrellisError, match="missing field 'moe_intermediate_size'"):
        trellisforge.Engine(target, kv_dtype="f32")


def test_unsupported_architecture_is_named(tmp_path, model_dir):
    target = copy_with_config(tmp_path, model_dir, lambda c: c.update(architectures=["KimiLinearForCausalLM"]))
    with pytest.raises(TrellisError, match="unsupported architecture .KimiLinearForCausalLM.") as caught:
        trellisforge.Engine(target, kv_dtype="f32")
    assert caught.value.status_name == "unsupported"


def test_config_that_disagrees_with_the_weights(tmp_path, model_dir):
    target = copy_with_config(tmp_path, model_dir, lambda c: c.update(hidden_size=640))
    with pytest.raises(TrellisError, match="does not fit the model's|expected"):
        trellisforge.Engine(target, kv_dtype="f32")


def test_unknown_backend_and_cuda_without_a_gpu(model_dir):
    with pytest.raises(ValueError):
        trellisforge.Engine(model_dir, backend="tpu", kv_dtype="f32")
    if trellisforge.cuda_available()[0]:
        pytest.skip("a GPU is present: tests/test_cuda_engine.py covers the CUDA backend")
    with pytest.raises(TrellisError, match="CUDA unavailable") as caught:
        trellisforge.Engine(model_dir, backend="cuda", kv_dtype="f32")
    assert caught.value.status_name == "cuda"
