"""Config variants the fixtures do not carry, on small random checkpoints written here: q/k RMSNorm,
group-limited routing, no attention bias, other rotary fractions, the rope types transformers
computes once (yarn, linear, llama3, proportional), tied embeddings, several shared experts, an MTP
layer to skip, and EXL3 layers of other codebooks. The engine must match the float64 numpy reference
(python/trellisforge/reference/glm.py) on each; where transformers is installed, the reference
matches it on the rope types."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import relative_l2, within
from exl3_files import random_layer

import trellisforge
from trellisforge import TrellisError, safetensors_io
from trellisforge.reference import glm as glm_reference

TOL = 1e-4  # f32 engine vs float64 reference

BASE = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 128,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "partial_rotary_factor": 0.5, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "attention_bias": True,
    "use_qk_norm": False, "vocab_size": 300, "intermediate_size": 256, "moe_intermediate_size": 128,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
    "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
    "tie_word_embeddings": False, "max_position_embeddings": 512, "hidden_act": "silu",
}


def write_model(path, config: dict, exl3_codebook: str | None = None, mtp_layer: bool = False, seed: int = 0):
    """A random unquantized (bf16/f32) checkpoint; with exl3_codebook the attention and expert
    projections are random EXL3 layers of that codebook instead."""
    rng = np.random.default_rng(seed)
    c = config
    h, d = c["hidden_size"], c["head_dim"]
    tensors, dtypes = {}, {}

    def dense(name, out_features, in_features, scale=0.05, bias=False):
        tensors[f"{name}.weight"] = (rng.standard_normal((out_features, in_features)) * scale).astype(np.float32)
        if bias:
            tensors[f"{name}.bias"] = (rng.standard_normal(out_features) * 0.02).astype(np.float32)

    def bf16(name, values):
        tensors[name] = (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        dtypes[name] = "BF16"

    def projection(name, in_features, out_features, bias=False):
        if exl3_codebook:
            layer = random_layer(rng, name, in_features, out_features, 4, exl3_codebook, bias=bias)
            layer[f"{name}.svh"] = (layer[f"{name}.svh"] * 0.4).astype(np.float16)
            tensors.update(layer)
        else:
            dense(name, out_features, in_features, bias=bias)

    def mlp(prefix, intermediate):
        projection(f"{prefix}.gate_proj", h, intermediate)
        projection(f"{prefix}.up_proj", h, intermediate)
        projection(f"{prefix}.down_proj", intermediate, h)

    bf16("model.embed_tokens.weight", rng.standard_normal((c["vocab_size"], h)))
    layers = c["num_hidden_layers"] + (1 if mtp_layer else 0)
    for layer in range(layers):
        p = f"model.layers.{layer}"
        bf16(f"{p}.input_layernorm.weight", 1 + 0.1 * rng.standard_normal(h))
        bf16(f"{p}.post_attention_layernorm.weight", 1 + 0.1 * rng.standard_normal(h))
        projection(f"{p}.self_attn.q_proj", h, c["num_attention_heads"] * d, bias=c["attention_bias"])
        projection(f"{p}.self_attn.k_proj", h, c["num_key_value_heads"] * d, bias=c["attention_bias"])
        projection(f"{p}.self_attn.v_proj", h, c["num_key_value_heads"] * d, bias=c["attention_bias"])
        projection(f"{p}.self_attn.o_proj", c["num_attention_heads"] * d, h)
        if c["use_qk_norm"]:
            bf16(f"{p}.self_attn.q_norm.weight", 1 + 0.2 * rng.standard_normal(d))
            bf16(f"{p}.self_attn.k_norm.weight", 1 + 0.2 * rng.standard_normal(d))
        if layer < c["first_k_dense_replace"]:
            mlp(f"{p}.mlp", c["intermediate_size"])
            continue
        dense(f"{p}.mlp.gate", c["n_routed_experts"], h, scale=0.2)
        tensors[f"{p}.mlp.gate.e_score_correction_bias"] = (rng.standard_normal(c["n_routed_experts"]) * 0.05).astype(np.float32)
        for e in range(c["n_routed_experts"]):
            mlp(f"{p}.mlp.experts.{e}", c["moe_intermediate_size"])
        if c["n_shared_experts"]:
            mlp(f"{p}.mlp.shared_experts", c["moe_intermediate_size"] * c["n_shared_experts"])
    bf16("model.norm.weight", 1 + 0.1 * rng.standard_normal(h))
    if not c["tie_word_embeddings"]:
        dense("lm_head", c["vocab_size"], h)
    path.mkdir(parents=True, exist_ok=True)
    safetensors_io.save(path / "model.safetensors", tensors, dtypes)
    (path / "config.json").write_text(json.dumps(config))
    return path


VARIANTS = {
    "qk_norm": {"use_qk_norm": True},
    "group_limited_routing": {"n_routed_experts": 8, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3},
    "no_bias_full_rotary": {"attention_bias": False, "partial_rotary_factor": 1.0, "rope_theta": 1e6},
    "rope_parameters_and_mha": {"num_key_value_heads": 4, "partial_rotary_factor": None, "rope_theta": None,
                                "rope_parameters": {"rope_theta": 5e5, "partial_rotary_factor": 0.25, "rope_type": "default"}},
    "tied_embeddings_two_shared": {"tie_word_embeddings": True, "n_shared_experts": 2, "routed_scaling_factor": 1.0},
    "no_norm_topk_two_dense": {"norm_topk_prob": False, "first_k_dense_replace": 2},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_config_variant_matches_float64_reference(tmp_path, variant):
    config = {**BASE, **VARIANTS[variant]}
    config = {k: v for k, v in config.items() if v is not None}
    model_dir = write_model(tmp_path / variant, config, mtp_layer=variant == "qk_norm")
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, config["vocab_size"], 40)]
    expected, _ = glm_reference.Model(model_dir).forward(tokens)
    ours = trellisforge.Engine(model_dir, max_seqs=2, kv_dtype="f32").logits(tokens)
    worst = max(relative_l2(ours[t], expected[t]) for t in range(len(tokens)))
    within(worst, TOL, f"{variant}: worst position vs float64 reference")


ROPE_TYPES = {
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "proportional": {"rope_type": "proportional", "factor": 2.0},
}


def rope_config(kind: str) -> dict:
    return {**BASE, "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5, **ROPE_TYPES[kind]}}


@pytest.mark.parametrize("kind", sorted(ROPE_TYPES))
def test_rope_type_matches_float64_reference(tmp_path, kind):
    """Each type's frequencies (and yarn's factor on cos and sin) on both sides; the type moves the
    logits far beyond the tolerance, so a type read as the default would fail."""
    model_dir = write_model(tmp_path / kind, rope_config(kind))
    plain_dir = write_model(tmp_path / "plain", dict(BASE))
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, BASE["vocab_size"], 40)]
    expected, _ = glm_reference.Model(model_dir).forward(tokens)
    plain, _ = glm_reference.Model(plain_dir).forward(tokens)
    assert max(relative_l2(plain[t], expected[t]) for t in range(len(tokens))) > 100 * TOL, f"{kind} changes nothing"
    ours = trellisforge.Engine(model_dir, max_seqs=2, kv_dtype="f32").logits(tokens)
    worst = max(relative_l2(ours[t], expected[t]) for t in range(len(tokens)))
    within(worst, TOL, f"rope_type {kind}: worst position vs float64 reference")


@pytest.mark.parametrize("kind", sorted(ROPE_TYPES))
def test_reference_rope_types_match_transformers(tmp_path, kind):
    pytest.importorskip("torch", reason="torch is not installed (CI): the reference's formulas stand alone")
    from test_reference_mla import transformers_logits
    model_dir = write_model(tmp_path / kind, rope_config(kind))
    model = glm_reference.Model(model_dir)
    tokens = [int(t) for t in np.random.default_rng(2).integers(0, BASE["vocab_size"], 40)]
    expected = transformers_logits(model_dir, model, tokens)
    ours, _ = model.forward(tokens)
    within(max(relative_l2(ours[t], expected[t]) for t in range(len(tokens))), TOL, f"reference vs transformers, {kind}")


@pytest.mark.parametrize("codebook", ["3inst", "mcg", "mul1"])
def test_exl3_model_of_each_codebook_matches_float64_reference(tmp_path, codebook):
    model_dir = write_model(tmp_path / codebook, dict(BASE), exl3_codebook=codebook, seed=3)
    tokens = [int(t) for t in np.random.default_rng(2).integers(0, BASE["vocab_size"], 24)]
    expected, _ = glm_reference.Model(model_dir).forward(tokens)
    ours = trellisforge.Engine(model_dir, max_seqs=2, kv_dtype="f32").logits(tokens)
    worst = max(relative_l2(ours[t], expected[t]) for t in range(len(tokens)))
    within(worst, TOL, f"EXL3 {codebook} model: worst position vs float64 reference")


def test_missing_and_unexpected_tensors_are_named(tmp_path):
    model_dir = write_model(tmp_path / "m", dict(BASE))
    tensors = safetensors_io.load(model_dir / "model.safetensors")
    header, _ = safetensors_io.read_header(model_dir / "model.safetensors")
    dtypes = {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}
    broken = dict(tensors)
    del broken["model.layers.1.mlp.experts.3.up_proj.weight"]
    safetensors_io.save(model_dir / "model.safetensors", broken, dtypes)
    with pytest.raises(TrellisError, match="model.layers.1.mlp.experts.3.up_proj"):
        trellisforge.Engine(model_dir, kv_dtype="f32")
    extra = dict(tensors, **{"model.layers.1.mlp.stray.weight": np.zeros(4, dtype=np.float32)})
    safetensors_io.save(model_dir / "model.safetensors", extra, dtypes)
    with pytest.raises(TrellisError, match="unexpected tensor 'model.layers.1.mlp.stray.weight'"):
        trellisforge.Engine(model_dir, kv_dtype="f32")
    no_bias = {k: v for k, v in tensors.items() if k != "model.layers.0.self_attn.k_proj.bias"}
    safetensors_io.save(model_dir / "model.safetensors", no_bias, dtypes)
    with pytest.raises(TrellisError, match="k_proj.bias"):
        trellisforge.Engine(model_dir, kv_dtype="f32")


def test_unsupported_settings_are_refused_by_name(tmp_path):
    for edit, message in [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "rope_type .longrope. is not supported"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "rope_type .dynamic. is not supported"),
        ({"rope_scaling": {"rope_type": "linear"}}, "rope_parameters.factor"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "llama3 rope needs"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"n_group": 3}, "multiple of n_group"),
    ]:
        model_dir = write_model(tmp_path / message.replace(" ", "_"), {**BASE, **edit})
        with pytest.raises(TrellisError, match=message):
            trellisforge.Engine(model_dir, kv_dtype="f32")
