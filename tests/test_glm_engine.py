"""The GLM engine on the CPU against the references (shared/fixtures/README.md):
- the exact answer: transformers fp32 on the dequantized EXL3 weights (`dequant_ref`), and on the
  unquantized model (`hf_ref`);
- the peer's own logits and greedy tokens, which are ~1e-3 off that answer (more at M = 1 decode)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import relative_l2, within
from glm_fixtures import checkpoint_dir, model_config, prompts, reference_greedy, reference_logits, shared_peer_file

import trellisforge
from trellisforge import safetensors_io
from trellisforge.reference import glm as glm_reference

VARIANTS = ["3.0", "4.0"]
# Our f32 forward vs transformers' f32 forward of the same weights: summation order only (measured
# ~1.4e-6 per position on every prompt); a wrong RoPE pairing or routing gives > 1e-2.
TOL_VS_EXACT = 1e-4
# The peer is ~1e-3 from the exact answer at almost every position (fp16 inside its kernels).
TOL_VS_PEER = 3e-3
# Where the peer's greedy continuation leaves ours, its own top-2 gap there must be inside its decode
# error: 1-3% rel L2 at M = 1 (fixture README), so 4 x 3% of the logits' RMS.
PEER_DECODE_REL_ERROR = 0.03
# The peer routes on fp16 router logits (EXL3.md §10.7): selection scores near 0.5-1 round at
# 2^-11 ~ 4.9e-4 and its 512-term fp16 dot products add more; 4 ulps counts as a tie.
ROUTER_NEAR_TIE = 2e-3


@pytest.fixture(scope="module", params=VARIANTS + ["hf"])
def engine(request):
    engine = trellisforge.Engine(checkpoint_dir(request.param), max_seqs=8, kv_dtype="f32")
    yield request.param, engine
    stats = engine.stats()
    assert stats["pages_free"] == stats["pages_total"] and stats["sequences_live"] == 0
    engine.close()


def test_logits_match_the_exact_reference_at_every_position(engine):
    variant, model = engine
    reference = reference_logits(variant)
    for name, tokens in prompts().items():
        ours = model.logits(tokens)
        assert ours.shape == (len(tokens), model.vocab_size)
        worst = max(relative_l2(ours[t], reference[name][t]) for t in range(len(tokens)))
        within(worst, TOL_VS_EXACT, f"{variant} {name}: worst position vs exact reference")


def test_greedy_continuations_equal_the_exact_reference(engine):
    variant, model = engine
    expected = reference_greedy(variant)
    for name, tokens in prompts().items():
        assert model.generate(tokens, 32, stop_token_ids=[]) == expected[name], name


def test_decode_logprobs_match_the_reference_step_logits(engine):
    """The decode path (one row per step, KV from earlier steps) against the reference's logits at
    each greedy step, through the log-probabilities the engine reports."""
    variant, model = engine
    reference = reference_logits(variant)
    for name, tokens in prompts().items():
        events = list(model.stream(tokens, 32, stop_token_ids=[], top_logprobs=5))
        step_logits = reference[f"{name}__greedy_step_logits"].astype(np.float64)
        for step, event in enumerate(events):
            row = step_logits[step]
            log_softmax = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
            assert abs(event.logprob - log_softmax[event.token]) < 1e-4, (name, step)
            expected_top = np.argsort(-row, kind="stable")[:5]
            assert [t for t, _ in event.top][:2] == list(expected_top[:2]), (name, step)


@pytest.fixture(scope="module")
def float64_references():
    """The numpy float64 forward (python/trellisforge/reference/glm.py) of each EXL3 fixture: logits
    and routing scores per prompt, computed once."""
    cache = {}

    def get(variant):
        if variant not in cache:
            model = glm_reference.Model(checkpoint_dir(variant))
            cache[variant] = {name: model.forward(tokens) for name, tokens in prompts().items()}
        return cache[variant]
    return get


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_match_the_float64_reference(variant, float64_references):
    model = trellisforge.Engine(checkpoint_dir(variant), max_seqs=2, kv_dtype="f32")
    for name, tokens in prompts().items():
        expected, _ = float64_references(variant)[name]
        ours = model.logits(tokens)
        worst = max(relative_l2(ours[t], expected[t]) for t in range(len(tokens)))
        within(worst, TOL_VS_EXACT, f"{variant} {name}: worst position vs float64 reference")


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_against_the_peer(variant, float64_references):
    """Per position within the peer's precision, except after a near-tie routing flip (fixture
    README): the first position off must have a top-k routing margin within the peer's fp16 router
    rounding, which attention then carries forward."""
    model = trellisforge.Engine(checkpoint_dir(variant), max_seqs=2, kv_dtype="f32")
    peer = safetensors_io.load(shared_peer_file(f"exl3_logits_{variant}bpw.safetensors"))
    top_k = model_config(variant)["num_experts_per_tok"]
    for name, tokens in prompts().items():
        ours = model.logits(tokens)
        errors = np.array([relative_l2(ours[t], peer[name][t]) for t in range(len(tokens))])
        off = np.flatnonzero(errors > TOL_VS_PEER)
        clean = errors[: off[0]] if off.size else errors
        assert clean.size >= 1, f"{variant} {name}: off the peer from the first position"
        within(float(clean.max()), TOL_VS_PEER, f"{variant} {name}: worst of {clean.size} positions before any routing flip vs peer")
        if off.size == 0:
            continue
        _, routing = float64_references(variant)[name]
        first = int(off[0])
        margin = min(float(scores[first, top_k - 1] - scores[first, top_k]) for scores in routing)
        within(margin, ROUTER_NEAR_TIE, f"{variant} {name}: routing margin at position {first}, where the peer leaves us")


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_against_the_peer_diverges_only_on_its_near_ties(variant):
    import json
    model = trellisforge.Engine(checkpoint_dir(variant), max_seqs=2, kv_dtype="f32")
    peer_tokens = json.loads(shared_peer_file(f"exl3_greedy_{variant}bpw.json").read_text())
    peer_logits = safetensors_io.load(shared_peer_file(f"exl3_greedy_logits_{variant}bpw.safetensors"))
    for name, tokens in prompts().items():
        ours = model.generate(tokens, 32, stop_token_ids=[])
        step = next((i for i, (a, b) in enumerate(zip(ours, peer_tokens[name])) if a != b), None)
        if step is None:
            continue
        key = name if name in peer_logits else f"{name}__greedy_step_logits"
        row = peer_logits[key][step].astype(np.float64)
        gap = row[peer_tokens[name][step]] - row[ours[step]]
        tolerance = 4 * PEER_DECODE_REL_ERROR * float(np.sqrt(np.mean(row ** 2)))
        within(gap, tolerance, f"{variant} {name}: peer's top-2 gap where it leaves ours (step {step})")
