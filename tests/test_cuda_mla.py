"""GLM-4.7-Flash (MLA) and GLM-5.x (MLA + DSA) on the CUDA backend, against the CPU forward and
the exact answer: logits at every position, greedy continuations, batch invariance and chunk
boundaries bit for bit, attention spread over splits or run a block per row with the same bits,
recorded graphs, KV pages, and the head products on f16 weights with the bits of f32 ones. Skips, with the library's reason, where no GPU is usable."""
from __future__ import annotations

import json

import mla_models
import numpy as np
import pytest
from conftest import relative_l2, within
from test_mla_engine import FAMILIES, family_or_skip, first_tie, worst

import trellisforge
from trellisforge import safetensors_io
from trellisforge.reference import glm as glm_reference

AVAILABLE, REASON = trellisforge.cuda_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")
# Both f32; they differ in summation order (warp trees, fused multiply-adds).
TOL_GPU = 1e-4


@pytest.fixture(scope="module", params=FAMILIES)
def engines(request):
    root = family_or_skip(request.param)
    gpu = trellisforge.Engine(root / "exl3_3.0bpw", backend="cuda", max_seqs=8, kv_dtype="f32")
    cpu = trellisforge.Engine(root / "exl3_3.0bpw", backend="cpu", max_seqs=8, kv_dtype="f32")
    yield request.param, root, gpu, cpu
    stats = gpu.stats()
    assert stats["pages_free"] == stats["pages_total"]


def prompts(root) -> dict:
    return json.loads((root / "prompts.json").read_text())


def test_gpu_logits_match_cpu_and_the_exact_answer(engines):
    family, root, gpu, cpu = engines
    expected = safetensors_io.load(root / "dequant_ref" / "3.0bpw" / "dequant_fp32_logits.safetensors")
    for name, tokens in prompts(root).items():
        on_gpu = gpu.logits(tokens)
        on_cpu = cpu.logits(tokens)
        positions = range(len(tokens))
        if family == "glm_moe_dsa":
            reference = glm_reference.Model(root / "exl3_3.0bpw")
            reference.forward(tokens)
            tie = first_tie(reference)
            # After a tied selection a near-tie can also flip between the GPU's and the CPU's sums.
            positions = range(tie) if tie is not None else positions
        within(worst(on_gpu, on_cpu, positions), TOL_GPU, f"{family} {name}: GPU vs CPU")
        within(worst(on_gpu, expected[name], positions), TOL_GPU, f"{family} {name}: GPU vs exact ({len(positions)} positions)")


def test_gpu_greedy_equals_the_exact_answer(engines):
    family, root, gpu, _ = engines
    greedy = json.loads((root / "dequant_ref" / "3.0bpw" / "dequant_fp32_greedy.json").read_text())
    for name, tokens in prompts(root).items():
        if family == "glm_moe_dsa" and name == "long":
            continue  # the indexer's exact ties (test_mla_engine.py)
        assert gpu.generate(tokens, 32, stop_token_ids=[]) == greedy[name], name


def test_gpu_batch_invariance_and_chunk_boundaries_bit_for_bit(engines):
    _, root, gpu, _ = engines
    p = prompts(root)
    alone = gpu.logits(p["long"])
    batched = gpu.logits_batch([p["short"], p["long"], p["chat"]])[1]
    assert np.array_equal(alone.view(np.uint32), batched.view(np.uint32))
    small = trellisforge.Engine(root / "exl3_3.0bpw", backend="cuda", max_seqs=2, rows_max=7, page_tokens=5, kv_dtype="f32")
    assert np.array_equal(small.logits(p["long"]).view(np.uint32), alone.view(np.uint32))


def test_spread_attention_and_graphs_keep_the_bits(engines, monkeypatch):
    """Decode steps (few rows) spread MLA attention over splits and replay recorded graphs; with
    both off a block per row runs every split: the generated tokens' log-probabilities are the
    same bits."""
    _, root, gpu, _ = engines
    tokens = prompts(root)["long"]
    spread = [e.logprob for e in gpu.stream(tokens, max_tokens=12, stop_token_ids=[], temperature=0.8, seed=3)]
    monkeypatch.setenv("TF_CUDA_ATTENTION_SPREAD", "0")
    monkeypatch.setenv("TF_CUDA_GRAPHS", "0")
    whole = trellisforge.Engine(root / "exl3_3.0bpw", backend="cuda", max_seqs=2, kv_dtype="f32")
    alone = [e.logprob for e in whole.stream(tokens, max_tokens=12, stop_token_ids=[], temperature=0.8, seed=3)]
    assert np.array_equal(np.float32(spread).view(np.uint32), np.float32(alone).view(np.uint32))
    assert gpu.stats()["graph_replays"] > 0


def test_gpu_decode_matches_cpu_under_continuous_batching(engines):
    _, root, gpu, cpu = engines
    p = prompts(root)
    for name in ("chat", "random"):
        on_gpu = [e.logprob for e in gpu.stream(p[name], max_tokens=10, stop_token_ids=[])]
        on_cpu = [e.logprob for e in cpu.stream(p[name], max_tokens=10, stop_token_ids=[])]
        assert np.max(np.abs(np.array(on_gpu) - np.array(on_cpu))) < 1e-3, name
    assert relative_l2(np.array(on_gpu), np.array(on_cpu)) < 1e-4


@pytest.mark.parametrize("model_type", ["glm4_moe_lite", "glm_moe_dsa"])
def test_head_products_on_f16_weights_keep_the_bits(model_type, tmp_path, monkeypatch):
    """kv_b_proj stored fp16 (as the peer writes it) puts W_UK and W_UV on the GPU as f16, half the
    bytes a decode step reads; TF_CUDA_MLA_HALF=0 keeps them f32. A 90-row prompt chunk (the
    products for many rows, tf_mla_head_rows) and sampled tokens' log-probabilities through
    replayed graphs (tf_mla_absorb, tf_mla_v_up) are the same bits; the timelines show which
    entries ran."""
    root = mla_models.write_gpu_shaped(tmp_path / model_type, model_type)
    tokens = [int(t) for t in np.random.default_rng(5).integers(3, 300, 90)]

    def run():
        with trellisforge.Engine(root, backend="cuda", max_seqs=2, kv_dtype="f32") as engine:
            engine.add(tokens, trellisforge.Sampling(max_tokens=8, temperature=0.8, seed=3), stop_token_ids=[])
            logprobs, names, step = [], set(), 0
            while engine.stats()["sequences_live"] or engine.stats()["sequences_waiting"]:
                timed = step in (0, 3)  # the prompt's chunk, a decode step
                if timed:
                    engine.time_next_step()
                logprobs += [e.logprob for e in engine.step()]
                if timed:
                    names |= {e["name"] for e in engine.timeline()}
                step += 1
            assert engine.stats()["graph_replays"] > 0
            logits = engine.logits(tokens)
        return logits, np.array(logprobs, dtype=np.float32), names

    half_logits, half_logprobs, half_names = run()
    monkeypatch.setenv("TF_CUDA_MLA_HALF", "0")
    f32_logits, f32_logprobs, f32_names = run()
    half_entries = {"tf_mla_head_rows_half", "tf_mla_absorb_half", "tf_mla_v_up_half"}
    f32_entries = {"tf_mla_head_rows", "tf_mla_absorb", "tf_mla_v_up"}
    assert half_entries <= half_names and not f32_entries & half_names
    assert f32_entries <= f32_names and not half_entries & f32_names
    assert len(half_logprobs) == 8
    assert np.array_equal(half_logits.view(np.uint32), f32_logits.view(np.uint32))
    assert np.array_equal(half_logprobs.view(np.uint32), f32_logprobs.view(np.uint32))


@pytest.mark.parametrize("model_type", ["glm4_moe_lite", "glm_moe_dsa"])
def test_q_a_and_kv_a_in_one_launch_keep_the_bits(model_type, tmp_path, monkeypatch):
    """A decode step's rows run q_a_proj and kv_a_proj_with_mqa (EXL3, one input) as one GEMV
    launch, tf_exl3_parts_linear (one row; 2 to 4 rows, tf_exl3_parts_linear4's one block a
    place), and in a layer running its DSA indexer q_b_proj with the
    indexer's wq_b (both on the normed q latent), each part with the k split of its own launch;
    TF_CUDA_PARTS=0 runs them apart. One, two and three streams' sampled log-probabilities through replayed graphs
    (and the prompt's logits) are the same bits, and the timelines show which launches ran."""
    root = mla_models.write_gpu_shaped(tmp_path / model_type, model_type)
    prompts = [[int(t) for t in np.random.default_rng(seed).integers(3, 300, 20 + 7 * seed)] for seed in range(3)]

    def run():
        with trellisforge.Engine(root, backend="cuda", max_seqs=3, kv_dtype="f32") as engine:
            logprobs, names = [], set()
            for streams in (1, 2, 3):
                ids = [engine.add(p, trellisforge.Sampling(max_tokens=5, temperature=0.8, seed=s), stop_token_ids=[])
                       for s, p in enumerate(prompts[:streams])]
                step = 0
                while engine.stats()["sequences_live"] or engine.stats()["sequences_waiting"]:
                    if step == 2:  # a decode step of every stream
                        engine.time_next_step()
                    events = engine.step()
                    logprobs += [(streams, ids.index(e.sequence_id), e.logprob) for e in events]
                    if step == 2:
                        launched = [e["name"] for e in engine.timeline()]
                        names |= set(launched)
                        parts_launches = launched.count("tf_exl3_parts_linear") + launched.count("tf_exl3_parts_linear4")
                    step += 1
            assert engine.stats()["graph_replays"] > 0
            logits = engine.logits(prompts[0])
        return logits, logprobs, names, parts_launches

    together, together_logprobs, together_names, launches = run()
    monkeypatch.setenv("TF_CUDA_PARTS", "0")
    apart, apart_logprobs, apart_names, _ = run()
    assert "tf_exl3_parts_linear" in together_names and "tf_exl3_parts_linear4" in together_names
    assert not {"tf_exl3_parts_linear", "tf_exl3_parts_linear4"} & apart_names
    layers = json.loads((root / "config.json").read_text())["num_hidden_layers"]
    # Each layer's q_a/kv_a launch, and where the indexer runs (every layer here) its q_b/wq_b.
    assert launches == (2 * layers if model_type == "glm_moe_dsa" else layers), launches
    assert len(together_logprobs) == 5 * 6
    assert together_logprobs == apart_logprobs  # floats compared exactly
    assert np.array_equal(together.view(np.uint32), apart.view(np.uint32))


def test_the_indexer_scores_forms_give_the_same_bits(tmp_path):
    """The DSA indexer scores positions a thread each (tf_dsa_scores) where a chunk's rows and
    positions make many blocks, four threads each (tf_dsa_scores_lanes) where they make few: the
    same multiply-adds in the same order. A 500-token prompt through the GLM-5-shaped model (index
    top-8, 512 positions) in one chunk (the first form: 64 rows of scores at a time) and in 7-row
    chunks (the second) gives the same logits bit for bit; the timelines show which form ran."""
    root = mla_models.write_gpu_shaped(tmp_path / "glm_moe_dsa", "glm_moe_dsa")
    tokens = [int(t) for t in np.random.default_rng(8).integers(3, 300, 500)]

    def run(rows_max, timed_step):
        with trellisforge.Engine(root, backend="cuda", max_seqs=1, rows_max=rows_max, kv_dtype="f32") as engine:
            engine.add(tokens, trellisforge.Sampling(max_tokens=1), stop_token_ids=[])
            names, step = set(), 0
            while engine.stats()["sequences_live"] or engine.stats()["sequences_waiting"]:
                if step == timed_step:
                    engine.time_next_step()
                engine.step()
                if step == timed_step:
                    names = {e["name"] for e in engine.timeline()}
                step += 1
            return engine.logits(tokens), names

    wide, wide_names = run(1024, 0)
    narrow, narrow_names = run(7, 60)  # a 7-row chunk at ~420 positions: 7 x 14 blocks of 32
    assert "tf_dsa_scores" in wide_names and "tf_dsa_scores_lanes" not in wide_names
    assert "tf_dsa_scores_lanes" in narrow_names and "tf_dsa_scores" not in narrow_names
    assert np.array_equal(wide.view(np.uint32), narrow.view(np.uint32))
