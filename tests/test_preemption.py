"""The shared KV pool running out mid-generation (engine/admission.zig): the youngest running
sequence is preempted, computes its tokens again when pages free up, and gives exactly the tokens
and logprobs it gives alone, greedy or drawn, with penalties, with or without the prefix cache, on
the 3.0 bpw fixture; cancelling a preempted sequence frees everything. On the CPU and, where there
is one, the GPU (generated rows recomputed keep the GEMV's path, prompt rows the prompt kernels')."""
from __future__ import annotations

import numpy as np
import pytest
from glm_fixtures import checkpoint_dir, prompts

import trellisforge
from trellisforge import Sampling

CUDA, WHY_NOT = trellisforge.cuda_available()
BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason=f"no usable GPU: {WHY_NOT}"))]
SAMPLINGS = [
    Sampling(max_tokens=40, top_logprobs=2),
    Sampling(max_tokens=40, temperature=0.8, top_p=0.9, seed=3),
    Sampling(max_tokens=40, temperature=0.7, repetition_penalty=1.3, presence_penalty=0.4, seed=5),
]


def run_together(engine, requests, cancel_when_waiting=None):
    """Adds every (tokens, sampling) request and steps until all end; returns each one's events.
    cancel_when_waiting: the index of a request to cancel the first time it waits after running."""
    ids = [engine.add(tokens, sampling, stop_token_ids=[]) for tokens, sampling in requests]
    events = {i: [] for i in ids}
    cancelled = None
    for _ in range(10_000):
        for event in engine.step():
            events[event.sequence_id].append(event)
        if cancel_when_waiting is not None and cancelled is None:
            victim = ids[cancel_when_waiting]
            if events[victim] and engine.stats()["preemptions"] > 0 and engine.stats()["sequences_waiting"] > 0:
                engine.cancel(victim)
                cancelled = victim
        if all(i == cancelled or (e and e[-1].finish_reason) for i, e in events.items()):
            return [events[i] for i in ids], cancelled
    raise AssertionError("sequences did not finish")


def fingerprint(events):
    return [(e.token, np.float32(e.logprob).tobytes(), e.top) for e in events]


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture(scope="module")
def alone(backend):
    """Each request run by itself in a pool that holds them all."""
    engine = trellisforge.Engine(checkpoint_dir("3.0"), backend=backend, max_seqs=3, kv_dtype="f32")
    p = prompts()
    return [fingerprint(run_together(engine, [(p[name], sampling)])[0][0]) for name, sampling in zip(("chat", "short", "random"), SAMPLINGS)]


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_preempted_sequences_give_the_tokens_they_give_alone(backend, alone, prefix_cache):
    """Three sequences that grow to 77, 65 and 63 positions in a pool of 96 (12 pages of 8), with
    16-row steps so prompts take several: preemptions happen, and every token and logprob is the
    one the sequence gives alone; the pool is whole again after."""
    engine = trellisforge.Engine(checkpoint_dir("3.0"), backend=backend, max_seqs=3, page_tokens=8, kv_pages=12, rows_max=16,
                                 prefix_cache=prefix_cache, kv_dtype="f32")
    assert engine.stats()["context_tokens_max"] == 96
    p = prompts()
    together, _ = run_together(engine, [(p[name], sampling) for name, sampling in zip(("chat", "short", "random"), SAMPLINGS)])
    stats = engine.stats()
    assert stats["preemptions"] > 0
    for name, events, expected in zip(("chat", "short", "random"), together, alone):
        assert fingerprint(events) == expected, name
    assert stats["sequences_live"] == stats["sequences_waiting"] == stats["pages_reserved"] == 0
    assert stats["pages_free"] == stats["pages_total"]
    if prefix_cache:
        assert stats["prefix_hit_tokens"] > 0  # a resumed prompt's full pages came back from the cache


def test_a_preempted_sequence_can_be_cancelled_while_it_waits(backend, alone):
    engine = trellisforge.Engine(checkpoint_dir("3.0"), backend=backend, max_seqs=3, page_tokens=8, kv_pages=12, rows_max=16,
                                 kv_dtype="f32")
    p = prompts()
    together, cancelled = run_together(engine, [(p[name], sampling) for name, sampling in zip(("chat", "short", "random"), SAMPLINGS)],
                                       cancel_when_waiting=2)
    assert cancelled is not None
    for events, expected in zip(together[:2], alone[:2]):
        assert fingerprint(events) == expected
    stats = engine.stats()
    assert stats["sequences_live"] == stats["sequences_waiting"] == stats["pages_reserved"] == 0
    assert stats["pages_free"] == stats["pages_total"]


def test_a_prompt_as_long_as_the_pool_runs_beside_nothing_else(backend):
    """The default context is the pool's: one sequence may use all of it, the others wait."""
    engine = trellisforge.Engine(checkpoint_dir("3.0"), backend=backend, max_seqs=2, page_tokens=16, kv_pages=22, kv_dtype="f32")
    assert engine.stats()["context_tokens_max"] == 352
    p = prompts()
    (long_events, short_events), _ = run_together(engine, [(p["long"], Sampling(max_tokens=32)), (p["short"], Sampling(max_tokens=8))])
    assert len(long_events) == 32 and long_events[-1].finish_reason == "length"
    assert len(short_events) == 8
    assert engine.stats()["pages_free"] == engine.stats()["pages_total"]


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_a_recurrent_models_preempted_sequences_give_the_tokens_they_give_alone(tmp_path_factory, backend, prefix_cache):
    """GLM-5.3-Flash's shape (KDA state, NoPE MLA with the k-pooled indexer, hyper-connections) on a
    small random checkpoint: a preempted sequence's state starts again at position 0 (or at a
    cached page's snapshot) and its tokens are the ones it gives alone."""
    from glm5_next_models import prompt, variant_config, write_variant
    path = tmp_path_factory.mktemp("glm5_next")
    if backend == "cuda":  # the CUDA MLA kernels' shapes (kv_lora_rank 512, ...), EXL3 experts
        from test_cuda_glm5_next import gpu_variant
        model = gpu_variant(path, "base")
    else:
        model = write_variant(path, "base")
    config = variant_config("base")
    requests = [(prompt(config, seed=s, length=n), sampling) for s, n, sampling in zip((1, 2, 3), (40, 30, 24), SAMPLINGS)]
    roomy = trellisforge.Engine(model, backend=backend, max_seqs=3, kv_dtype="f32")
    expected = [fingerprint(run_together(roomy, [request])[0][0]) for request in requests]
    engine = trellisforge.Engine(model, backend=backend, max_seqs=3, page_tokens=8, kv_pages=12, rows_max=16,
                                 prefix_cache=prefix_cache, kv_dtype="f32")
    together, _ = run_together(engine, requests)
    assert engine.stats()["preemptions"] > 0
    for events, alone_events in zip(together, expected):
        assert fingerprint(events) == alone_events
    assert engine.stats()["pages_free"] == engine.stats()["pages_total"]
