"""Grammar-constrained sampling at the engine (tf_engine_set_token_mask) on the 3.0 bpw fixture: a
constrained sequence samples only allowed tokens, greedy and drawn; a mask changes nothing but the
choice (its logprobs are the model's, checked against an unconstrained run of the same sequence);
a constrained sequence never samples without a mask; bad masks are refused. On the CPU and, where
there is one, the GPU (whose sampler masked rows bypass)."""
from __future__ import annotations

import numpy as np
import pytest
from glm_fixtures import checkpoint_dir, prompts

import trellisforge
from trellisforge import Sampling, TrellisError


CUDA, WHY_NOT = trellisforge.cuda_available()


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason=f"no usable GPU: {WHY_NOT}"))])
def engine(request):
    with trellisforge.Engine(checkpoint_dir("3.0"), max_seqs=4, backend=request.param, kv_dtype="f32") as e:
        yield e


def mask_of(allowed, vocab: int) -> np.ndarray:
    words = np.zeros((vocab + 31) // 32, dtype=np.uint32)
    for token in allowed:
        words[token // 32] |= np.uint32(1) << np.uint32(token % 32)
    return words


def run(engine, prompt, sampling: Sampling, masks) -> list:
    """Generates with masks[i] (a token set, or None for free) before token i."""
    sequence_id = engine.add(prompt, sampling, stop_token_ids=[])
    events = []
    if sampling.constrained:
        engine.set_token_mask(sequence_id, None if masks[0] is None else mask_of(masks[0], engine.vocab_size))
    while not events or events[-1].finish_reason is None:
        for event in engine.step():
            assert event.sequence_id == sequence_id
            events.append(event)
            if event.finish_reason is None and sampling.constrained:
                allowed = masks[len(events)]
                engine.set_token_mask(sequence_id, None if allowed is None else mask_of(allowed, engine.vocab_size))
    return events


@pytest.mark.parametrize("temperature", [0.0, 1.3])
def test_masked_tokens_are_never_sampled(engine, temperature):
    rng = np.random.default_rng(4)
    masks = [set(rng.choice(engine.vocab_size, size=int(rng.integers(1, 6)), replace=False).tolist()) for _ in range(24)]
    events = run(engine, prompts()["short"], Sampling(max_tokens=24, temperature=temperature, seed=9, constrained=True), masks)
    assert len(events) == 24
    for event, allowed in zip(events, masks):
        assert event.token in allowed


def test_a_mask_changes_the_choice_not_the_logprobs(engine):
    """Greedy under a mask that allows the free run's token and a few others picks exactly what the
    free run picks, with the same logprob bits; the model is untouched by masking."""
    prompt = prompts()["chat"]
    free = run(engine, prompt, Sampling(max_tokens=12, top_logprobs=5), None)
    masks = [{event.token, *(t for t, _ in event.top[1:3])} for event in free]
    masked = run(engine, prompt, Sampling(max_tokens=12, top_logprobs=5, constrained=True), masks)
    assert [e.token for e in masked] == [e.token for e in free]
    assert [np.float32(e.logprob).tobytes() for e in masked] == [np.float32(e.logprob).tobytes() for e in free]
    # Now forbid the free run's first choice: the second-best comes out, its logprob as the model gave it.
    second_token, second_logprob = free[0].top[1]
    (event,) = run(engine, prompt, Sampling(max_tokens=1, constrained=True), [{second_token}])
    assert event.token == second_token and event.logprob == pytest.approx(second_logprob, abs=1e-6)


def test_open_masks_sample_as_unconstrained(engine):
    """None (the server's reasoning phase) lets the token be anything: the same draws as a free run."""
    prompt = prompts()["short"]
    free = run(engine, prompt, Sampling(max_tokens=10, temperature=0.9, seed=3), None)
    open_ = run(engine, prompt, Sampling(max_tokens=10, temperature=0.9, seed=3, constrained=True), [None] * 10)
    assert [e.token for e in open_] == [e.token for e in free]


def test_a_constrained_sequence_never_samples_without_its_mask(engine):
    sequence_id = engine.add(prompts()["short"], Sampling(max_tokens=4, constrained=True), stop_token_ids=[])
    with pytest.raises(TrellisError, match="no mask"):
        engine.step()
    engine.set_token_mask(sequence_id, mask_of({5}, engine.vocab_size))
    (event,) = engine.step()
    assert event.token == 5
    with pytest.raises(TrellisError, match="no mask"):  # the token spent it
        engine.step()
    engine.cancel(sequence_id)
    assert engine.stats()["sequences_live"] == 0


def test_bad_masks_are_refused(engine):
    vocab = engine.vocab_size
    free_id = engine.add(prompts()["short"], Sampling(max_tokens=2), stop_token_ids=[])
    with pytest.raises(TrellisError, match="not added as constrained"):
        engine.set_token_mask(free_id, mask_of({1}, vocab))
    engine.cancel(free_id)
    sequence_id = engine.add(prompts()["short"], Sampling(max_tokens=2, constrained=True), stop_token_ids=[])
    with pytest.raises(TrellisError, match="allows no token"):
        engine.set_token_mask(sequence_id, np.zeros((vocab + 31) // 32, dtype=np.uint32))
    with pytest.raises(TrellisError, match="length"):
        engine.set_token_mask(sequence_id, np.ones(3, dtype=np.uint32))
    with pytest.raises(TrellisError, match="no live sequence"):
        engine.set_token_mask(sequence_id + 1000, mask_of({1}, vocab))
    engine.cancel(sequence_id)
