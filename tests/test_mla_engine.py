"""GLM-4.7-Flash (MLA) and GLM-5.x (MLA + DSA) on the engine's CPU backend: logits at every prompt
position against the exact answer (transformers fp32 on the dequantized fixture weights), greedy
decoding, batch invariance and chunk boundaries bit for bit, tensor parallelism; the variants the
fixtures do not carry against the float64 numpy reference; and checkpoints that lie about
themselves.

The DSA indexer's ties: keys tied exactly at the index_topk-th score (common: a key every head's
ReLU zeroes scores 0) are the implementation's choice. The engine takes the earlier positions, as
the float64 reference does by default; transformers' torch.topk took others on glm_moe_dsa's `long`
prompt (tests/test_reference_mla.py records them). So `long` is compared with dequant_ref before
its first tied query, and with the float64 reference at every position."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import SHARED, relative_l2, within
from mla_models import variant_config, write_model, write_variant

import trellisforge
from trellisforge import TrellisError, safetensors_io
from trellisforge.reference import dsa
from trellisforge.reference import glm as glm_reference

# f32 engine vs fp32 transformers / the float64 reference: measured 1.1-1.5e-6 at the worst
# position of every fixture prompt; a latent-norm eps of 1e-5, a rope pairing or a missed
# DSA mask each give > 1e-5.
TOL = 1e-5
FAMILIES = ["glm4_moe_lite", "glm_moe_dsa"]


def family_or_skip(family: str):
    path = SHARED.parent / family
    if not path.is_dir():
        pytest.skip(f"{path} is absent: the MLA fixtures are read from ../shared (too large to copy into tests/)")
    return path


def worst(logits: np.ndarray, expected: np.ndarray, positions=None) -> float:
    positions = range(len(expected)) if positions is None else positions
    return max(relative_l2(logits[t], expected[t]) for t in positions)


def first_tie(model: glm_reference.Model) -> int | None:
    """The first query whose indexer selection, in any layer, has an exact tie at the cut."""
    starts = [int(q[0]) for scores in model.indexer_scores.values()
              if (q := np.flatnonzero(dsa.selection_margins(scores, model.config["index_topk"]) == 0)).size]
    return min(starts) if starts else None


@pytest.fixture(scope="module", params=FAMILIES)
def fixture(request):
    root = family_or_skip(request.param)
    engine = trellisforge.Engine(root / "exl3_3.0bpw", max_seqs=4, kv_dtype="f32")
    yield request.param, root, engine
    engine.close()


def test_prompt_logits_match_the_exact_answer(fixture):
    family, root, engine = fixture
    expected = safetensors_io.load(root / "dequant_ref" / "3.0bpw" / "dequant_fp32_logits.safetensors")
    for name, tokens in json.loads((root / "prompts.json").read_text()).items():
        logits = engine.logits(tokens)
        positions = range(len(tokens))
        if family == "glm_moe_dsa":
            reference = glm_reference.Model(root / "exl3_3.0bpw")
            exact, _ = reference.forward(tokens)
            within(worst(logits, exact), TOL, f"{family} {name}: every position vs the float64 reference (earlier-position ties)")
            tie = first_tie(reference)
            if tie is not None:
                positions = range(tie)
        within(worst(logits, expected[name], positions), TOL, f"{family} {name}: {len(positions)} positions vs dequant_ref")


def test_greedy_decoding_matches_the_exact_answer(fixture):
    """32 greedy tokens per prompt equal transformers', and the logits each was taken from match
    its step logits (generated rows take the same absorbed attention as prompt rows)."""
    family, root, engine = fixture
    greedy = json.loads((root / "dequant_ref" / "3.0bpw" / "dequant_fp32_greedy.json").read_text())
    steps = safetensors_io.load(root / "dequant_ref" / "3.0bpw" / "dequant_fp32_logits.safetensors")
    for name, tokens in json.loads((root / "prompts.json").read_text()).items():
        if family == "glm_moe_dsa" and name == "long":
            continue  # the indexer's ties (above) change this prompt's continuation's logits
        generated = engine.generate(tokens, max_tokens=32, stop_token_ids=[], top_logprobs=1)
        assert generated == greedy[name], name
        events = list(engine.stream(tokens, max_tokens=32, stop_token_ids=[]))
        decoded = np.array([e.logprob for e in events])
        expected = steps[f"{name}__greedy_step_logits"].astype(np.float64)
        log_softmax = expected - np.log(np.exp(expected - expected.max(1, keepdims=True)).sum(1, keepdims=True)) - expected.max(1, keepdims=True)
        exact = log_softmax[np.arange(32), greedy[name]]
        assert np.max(np.abs(decoded - exact)) < 1e-4, name


def test_batch_invariance_and_chunk_boundaries_bit_for_bit(fixture):
    _, root, engine = fixture
    prompts = json.loads((root / "prompts.json").read_text())
    alone = engine.logits(prompts["long"])
    batched = engine.logits_batch([prompts["short"], prompts["long"], prompts["chat"]])[1]
    assert np.array_equal(alone.view(np.uint32), batched.view(np.uint32))
    chunked = trellisforge.Engine(root / "exl3_3.0bpw", max_seqs=2, rows_max=7, page_tokens=5, kv_dtype="f32").logits(prompts["long"])
    assert np.array_equal(alone.view(np.uint32), chunked.view(np.uint32))


def test_decode_rows_equal_prompt_rows(fixture):
    """A generated row and the same position computed as a prompt row take the same path: the
    logits of a decode step equal the prompt logits of the extended sequence, bit for bit."""
    _, root, engine = fixture
    tokens = json.loads((root / "prompts.json").read_text())["chat"]
    events = list(engine.stream(tokens, max_tokens=6, stop_token_ids=[], top_logprobs=3))
    extended = engine.logits(tokens + [e.token for e in events[:-1]])
    for i, event in enumerate(events):
        row = extended[len(tokens) - 1 + i].astype(np.float64)
        log_softmax = row - row.max() - np.log(np.exp(row - row.max()).sum())
        assert event.logprob == pytest.approx(log_softmax[event.token], abs=2e-6)


def test_tensor_parallel_equals_one_rank(fixture):
    _, root, engine = fixture
    tokens = json.loads((root / "prompts.json").read_text())["long"]
    two = trellisforge.Engine(root / "exl3_3.0bpw", max_seqs=2, tp_world=2, kv_dtype="f32")
    within(worst(two.logits(tokens), engine.logits(tokens)), 1e-5, "TP=2 vs TP=1")
    assert two.generate(tokens, max_tokens=8) == engine.generate(tokens, max_tokens=8)


VARIANTS = [("glm4_moe_lite", v) for v in ("plain", "no_q_lora", "other_heads_and_latents", "yarn", "yarn_attention_factor",
                                             "llama3_mscale", "rotate_half", "group_limited_routing", "mlp_layer_types", "attention_bias",
                                             "first_k_dense_replace_ignored", "exl3", "exl3_kv_b")] + \
           [("glm_moe_dsa", v) for v in ("plain", "dense_selection", "shared_indexer_layers", "indexer_schedule",
                                          "other_indexer_heads", "rope_flags_ignored", "yarn", "exl3", "exl3_kv_b")]


@pytest.mark.parametrize("family,variant", VARIANTS)
def test_variants_match_the_float64_reference(tmp_path, family, variant):
    model_dir = write_variant(tmp_path / variant, family, variant, seed=3)
    reference = glm_reference.Model(model_dir)
    tokens = [int(t) for t in np.random.default_rng(4).integers(0, reference.config["vocab_size"], 40)]
    expected, _ = reference.forward(tokens)
    engine = trellisforge.Engine(model_dir, max_seqs=2, rows_max=16, kv_dtype="f32")
    within(worst(engine.logits(tokens), expected), TOL, f"{family} {variant}: worst of {len(tokens)} positions")


def broken(tmp_path, edit) -> str:
    model_dir = write_variant(tmp_path / "model", "glm_moe_dsa", "plain")
    edit(model_dir)
    return str(model_dir)


def drop_tensor(name: str):
    def edit(model_dir):
        path = model_dir / "model.safetensors"
        header, _ = safetensors_io.read_header(path)
        tensors = safetensors_io.load(path)
        del tensors[name]
        safetensors_io.save(path, tensors, {k: v["dtype"] for k, v in header.items() if k in tensors})
    return edit


def set_config(**fields):
    def edit(model_dir):
        config = json.loads((model_dir / "config.json").read_text())
        config.update(fields)
        (model_dir / "config.json").write_text(json.dumps(config))
    return edit


@pytest.mark.parametrize("edit,fragments", [
    (drop_tensor("model.layers.1.self_attn.kv_a_layernorm.weight"), ["model.layers.1.self_attn.kv_a_layernorm.weight"]),
    (drop_tensor("model.layers.0.self_attn.indexer.wk.weight"), ["model.layers.0.self_attn.indexer.wk"]),
    (set_config(kv_lora_rank=96), ["kv_a_proj_with_mqa"]),
    (set_config(indexer_types=["shared", "full", "full"]), ["indexer_types[0]"]),
    (set_config(q_lora_rank=None), ["q_lora_rank"]),
    (set_config(mlp_layer_types=["dense", "huge", "sparse"]), ["mlp_layer_types"]),
    (set_config(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}), ["longrope"]),
])
def test_checkpoints_that_lie_get_clear_errors(tmp_path, edit, fragments):
    with pytest.raises(TrellisError) as caught:
        trellisforge.Engine(broken(tmp_path, edit), kv_dtype="f32")
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)


def test_a_load_failing_after_a_dequantized_kv_b_gives_a_clear_error(tmp_path):
    """kv_b_proj as EXL3 is dequantized at load; a tensor missing after it fails the load with a
    clear error, twice in one process, no crash. (That the cleanup frees the dequantized copy
    once, leaking nothing at any failed allocation, is loader.zig's test.)"""
    model_dir = write_variant(tmp_path / "model", "glm_moe_dsa", "exl3_kv_b")
    drop_tensor("model.layers.1.self_attn.o_proj.trellis")(model_dir)
    for _ in range(2):
        with pytest.raises(TrellisError, match="model.layers.1.self_attn.o_proj"):
            trellisforge.Engine(str(model_dir), kv_dtype="f32")
