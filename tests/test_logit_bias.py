"""OpenAI's logit_bias at the engine (tf_engine_set_logit_bias) on the 3.0 bpw fixture: the biased
choice is the argmax of the exact reference's logits plus the bias, and at every later token of the
model's own logits plus the bias; +100 forces a drawn token; a zero bias changes nothing; logprobs
stay the model's; bad biases are refused and leave no sequence behind. On the CPU and, where there
is one, the GPU (whose sampler biased rows bypass)."""
from __future__ import annotations

import numpy as np
import pytest
from glm_fixtures import checkpoint_dir, prompts, reference_logits

import trellisforge
from trellisforge import Sampling, TrellisError

CUDA, WHY_NOT = trellisforge.cuda_available()
# The engine's f32-KV logits are within ~1e-5 of the exact answer here: a choice is only asserted
# where the reference's winner leads the runner-up by far more.
MARGIN = 1e-2


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason=f"no usable GPU: {WHY_NOT}"))])
def engine(request):
    with trellisforge.Engine(checkpoint_dir("3.0"), max_seqs=4, backend=request.param, kv_dtype="f32") as e:
        yield e


def run(engine, prompt, sampling: Sampling) -> list:
    return [e for e in engine.stream(prompt, sampling.max_tokens, stop_token_ids=[], **_fields(sampling))]


def _fields(sampling: Sampling) -> dict:
    return {k: getattr(sampling, k) for k in ("temperature", "top_p", "top_k", "min_p", "seed", "top_logprobs", "logit_bias",
                                              "repetition_penalty")}


def biased_argmax(row: np.ndarray, bias: dict[int, float]) -> tuple[int, float]:
    """The argmax of row + bias and its lead over the runner-up."""
    moved = row.astype(np.float64).copy()
    for token, value in bias.items():
        moved[token] += value
    order = np.argsort(-moved, kind="stable")
    return int(order[0]), float(moved[order[0]] - moved[order[1]])


def test_the_first_biased_token_is_the_references_argmax_plus_the_bias(engine):
    """Ban the reference's three best next tokens and lift the tenth: the choice is the exact
    reference's argmax of logits + bias, for every fixture prompt."""
    reference = reference_logits("3.0")
    checked = 0
    for name, tokens in prompts().items():
        row = reference[name][len(tokens) - 1]
        order = np.argsort(-row.astype(np.float64), kind="stable")
        bias = {int(t): -100.0 for t in order[:3]} | {int(order[9]): float(row[order[0]] - row[order[9]])}
        expected, lead = biased_argmax(row, bias)
        if lead < MARGIN:
            continue
        (event,) = run(engine, tokens, Sampling(max_tokens=1, logit_bias=tuple(bias.items())))
        assert event.token == expected, name
        checked += 1
    assert checked >= 2


def test_every_token_takes_the_bias_and_logprobs_stay_the_models(engine):
    """Eight greedy tokens under a bias that bans each free run's token: each is the argmax of the
    model's logits at that position plus the bias, with the model's own log-softmax as logprob."""
    prompt = prompts()["chat"]
    free = run(engine, prompt, Sampling(max_tokens=8))
    bias = {e.token: -100.0 for e in free}
    events = run(engine, prompt, Sampling(max_tokens=8, logit_bias=tuple(bias.items())))
    assert len(events) == 8
    generated = [e.token for e in events]
    logits = engine.logits(prompt + generated[:-1])[len(prompt) - 1:].astype(np.float64)
    for step, event in enumerate(events):
        expected, lead = biased_argmax(logits[step], bias)
        assert event.token not in bias
        if lead > 1e-4:
            assert event.token == expected, step
        row = logits[step]
        log_softmax = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
        assert event.logprob == pytest.approx(log_softmax[event.token], abs=1e-4)


def test_plus_100_forces_a_drawn_token_and_zero_changes_nothing(engine):
    prompt = prompts()["short"]
    forced = run(engine, prompt, Sampling(max_tokens=12, temperature=1.3, seed=5, logit_bias=((1234, 100.0),)))
    assert [e.token for e in forced] == [1234] * 12
    free = run(engine, prompt, Sampling(max_tokens=10, top_logprobs=3))
    zero = run(engine, prompt, Sampling(max_tokens=10, top_logprobs=3, logit_bias=((free[0].token, 0.0), (7, 0.0))))
    assert [e.token for e in zero] == [e.token for e in free]
    assert [np.float32(e.logprob).tobytes() for e in zero] == [np.float32(e.logprob).tobytes() for e in free]
    assert [e.top for e in zero] == [e.top for e in free]


@pytest.mark.parametrize("bias, words", [
    (((10 ** 7, 1.0),), "outside the vocabulary"),
    (((5, 100.5),), "outside [-100, 100]"),
    (((5, float("nan")),), "outside [-100, 100]"),
    (((5, 1.0), (6, 2.0), (5, 3.0)), "entry 2 (token 5"),
    (tuple((t, 1.0) for t in range(1025)), "at most 1024"),
])
def test_bad_biases_are_refused_and_leave_no_sequence(engine, bias, words):
    with pytest.raises(TrellisError, match=words.replace("[", r"\[").replace("(", r"\(")):
        engine.add(prompts()["short"], Sampling(max_tokens=4, logit_bias=bias), [])
    stats = engine.stats()
    assert stats["sequences_live"] == 0 and stats["sequences_waiting"] == 0
    assert stats["pages_free"] == stats["pages_total"]


def test_a_bias_on_no_live_sequence_is_refused(engine):
    from trellisforge._ffi import ffi, lib
    tokens = ffi.new("uint32_t[]", [1])
    values = ffi.new("float[]", [1.0])
    assert lib.tf_engine_set_logit_bias(engine._handle, 987654, tokens, values, 1) != 0
    assert "no live sequence" in ffi.string(lib.tf_last_error()).decode()
    assert lib.tf_engine_set_logit_bias(engine._handle, 987654, ffi.NULL, ffi.NULL, 1) != 0
