"""Small random checkpoints of the MLA classes, B (`glm4_moe_lite`) and C (`glm_moe_dsa`), for the
tests: unquantized f32/bf16 tensors, or with the attention, indexer-query and expert projections as
random EXL3 layers (kv_b_proj and the rest of the indexer stay fp16, as the peer stores them). The
config variants cover what the fixtures do not: no q LoRA, other head counts and latent sizes,
rotate-half rope, YaRN, group-limited routing, sparse selection, shared indexer layers, explicit
mlp_layer_types."""
from __future__ import annotations

import json

import numpy as np
from exl3_files import random_layer

from trellisforge import safetensors_io
from trellisforge.reference import dsa
from trellisforge.reference import glm as glm_reference

BASE_LITE = {
    "architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite", "hidden_size": 128,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 128,
    "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "rope_interleave": True,
    "rms_norm_eps": 1e-5, "attention_bias": False, "vocab_size": 300, "intermediate_size": 256,
    "moe_intermediate_size": 128, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.8,
    "tie_word_embeddings": False, "max_position_embeddings": 512, "hidden_act": "silu",
}
BASE_DSA = {
    **BASE_LITE, "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
    "first_k_dense_replace": 1, "routed_scaling_factor": 2.5, "index_topk": 8, "index_n_heads": 4,
    "index_head_dim": 64,
}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 16}
COMMON_VARIANTS = {
    "plain": {},
    "other_heads_and_latents": {"num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 256,
                                "kv_lora_rank": 256, "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32},
    "yarn": {"rope_parameters": YARN},
    # mscale without mscale_all_dim: YaRN's attention factor lands on cos/sin, not on the softmax scale.
    "yarn_attention_factor": {"rope_parameters": {**YARN, "factor": 8.0, "mscale": None, "mscale_all_dim": None,
                                                  "original_max_position_embeddings": 32}},
    "group_limited_routing": {"n_group": 4, "topk_group": 2, "num_experts_per_tok": 3},
    "mlp_layer_types": {"num_hidden_layers": 4, "mlp_layer_types": ["dense", "sparse", "dense", "sparse"]},
    "attention_bias": {"attention_bias": True},
    "exl3": {},
    # kv_b_proj as EXL3 too (the peer keeps it fp16): the engine dequantizes it once at load.
    "exl3_kv_b": {},
}
LITE_VARIANTS = {
    **{name: dict(v) for name, v in COMMON_VARIANTS.items()},
    "no_q_lora": {"q_lora_rank": None},
    # transformers' yarn_apply_mscale scales the softmax for any rope_type but "default".
    "llama3_mscale": {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 16, "mscale_all_dim": 1.0}},
    "rotate_half": {"rope_interleave": False},
    # Class B's transformers config ignores this: without mlp_layer_types only layer 0 is dense.
    "first_k_dense_replace_ignored": {"first_k_dense_replace": 2},
}
DSA_VARIANTS = {
    **{name: dict(v) for name, v in COMMON_VARIANTS.items()},
    "dense_selection": {"index_topk": 64},
    "shared_indexer_layers": {"num_hidden_layers": 4, "indexer_types": ["full", "shared", "full", "shared"]},
    "indexer_schedule": {"num_hidden_layers": 4, "index_topk_freq": 2, "index_skip_topk_offset": 2},
    "other_indexer_heads": {"index_n_heads": 2, "index_head_dim": 128, "index_topk": 5},
    # Class C ignores both flags (transformers hard-codes interleaved rope there).
    "rope_flags_ignored": {"rope_interleave": False, "indexer_rope_interleave": False},
}


def variant_config(model_type: str, variant: str) -> dict:
    base, variants = (BASE_LITE, LITE_VARIANTS) if model_type == "glm4_moe_lite" else (BASE_DSA, DSA_VARIANTS)
    config = {**base, **variants[variant]}
    if isinstance(config.get("rope_parameters"), dict):
        config["rope_parameters"] = {k: v for k, v in config["rope_parameters"].items() if v is not None}
    return config


def pad128(n: int) -> int:
    return -(-n // 128) * 128


def write_model(path, config: dict, exl3_codebook: str | None = None, seed: int = 0, kv_b_exl3: bool = False):
    """A random checkpoint of `config` (class B or C) under path; with exl3_codebook the
    q/kv-a/o, indexer wq_b, MLP and expert projections are random EXL3 layers of that codebook,
    padded to 128 like the peer's (kv_a_proj_with_mqa's 576 outputs are stored as 640), and with
    kv_b_exl3 kv_b_proj as well."""
    rng = np.random.default_rng(seed)
    c = {**glm_reference.DEFAULTS[config["model_type"]], **config}
    h, heads = c["hidden_size"], c["num_attention_heads"]
    qk, tensors, dtypes = c["qk_nope_head_dim"] + c["qk_rope_head_dim"], {}, {}

    def dense(name, out_features, in_features, scale=None, bias=False, dtype=np.float32):
        scale = scale or 1.0 / np.sqrt(in_features)
        tensors[f"{name}.weight"] = (rng.standard_normal((out_features, in_features)) * scale).astype(dtype)
        if bias:
            tensors[f"{name}.bias"] = (rng.standard_normal(out_features) * 0.02).astype(dtype)

    def bf16(name, values):
        tensors[name] = (np.asarray(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        dtypes[name] = "BF16"

    def projection(name, in_features, out_features, bias=False):
        if not exl3_codebook:
            return dense(name, out_features, in_features, bias=bias)
        layer = random_layer(rng, name, pad128(in_features), pad128(out_features), 4, exl3_codebook, bias=bias)
        # The trellis weights have unit scale: bring the layer's gain to ~1 like dense() does.
        layer[f"{name}.svh"] = (layer[f"{name}.svh"] * 0.4 * np.sqrt(128 / pad128(in_features))).astype(np.float16)
        tensors.update(layer)

    def mlp(prefix, intermediate):
        projection(f"{prefix}.gate_proj", h, intermediate)
        projection(f"{prefix}.up_proj", h, intermediate)
        projection(f"{prefix}.down_proj", intermediate, h)

    def norm(name, size):
        bf16(name, 1 + 0.1 * rng.standard_normal(size))

    bias = c.get("attention_bias", False)
    full = dsa.indexer_types(c) if c["model_type"] == "glm_moe_dsa" else []
    bf16("model.embed_tokens.weight", rng.standard_normal((c["vocab_size"], h)))
    for layer, mlp_type in enumerate(glm_reference.mlp_layer_types(c)):
        p, a = f"model.layers.{layer}", f"model.layers.{layer}.self_attn"
        norm(f"{p}.input_layernorm.weight", h)
        norm(f"{p}.post_attention_layernorm.weight", h)
        if c["q_lora_rank"] is None:
            dense(f"{a}.q_proj", heads * qk, h)  # bias-free even with attention_bias
        else:
            projection(f"{a}.q_a_proj", h, c["q_lora_rank"], bias=bias)
            norm(f"{a}.q_a_layernorm.weight", c["q_lora_rank"])
            projection(f"{a}.q_b_proj", c["q_lora_rank"], heads * qk)
        projection(f"{a}.kv_a_proj_with_mqa", h, c["kv_lora_rank"] + c["qk_rope_head_dim"], bias=bias)
        norm(f"{a}.kv_a_layernorm.weight", c["kv_lora_rank"])
        if kv_b_exl3:
            projection(f"{a}.kv_b_proj", c["kv_lora_rank"], heads * (c["qk_nope_head_dim"] + c["v_head_dim"]))
        else:
            dense(f"{a}.kv_b_proj", heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"], dtype=np.float16)
        projection(f"{a}.o_proj", heads * c["v_head_dim"], h, bias=bias)
        if full and full[layer] == "full":
            i = f"{a}.indexer"
            projection(f"{i}.wq_b", c["q_lora_rank"], c["index_n_heads"] * c["index_head_dim"])
            dense(f"{i}.wk", c["index_head_dim"], h, dtype=np.float16)
            tensors[f"{i}.k_norm.weight"] = (1 + 0.1 * rng.standard_normal(c["index_head_dim"])).astype(np.float16)
            tensors[f"{i}.k_norm.bias"] = (0.1 * rng.standard_normal(c["index_head_dim"])).astype(np.float16)
            dense(f"{i}.weights_proj", c["index_n_heads"], h, dtype=np.float16)
        if mlp_type == "dense":
            mlp(f"{p}.mlp", c["intermediate_size"])
            continue
        dense(f"{p}.mlp.gate", c["n_routed_experts"], h, scale=0.2)
        tensors[f"{p}.mlp.gate.e_score_correction_bias"] = (rng.standard_normal(c["n_routed_experts"]) * 0.05).astype(np.float32)
        for e in range(c["n_routed_experts"]):
            mlp(f"{p}.mlp.experts.{e}", c["moe_intermediate_size"])
        if c["n_shared_experts"]:
            mlp(f"{p}.mlp.shared_experts", c["moe_intermediate_size"] * c["n_shared_experts"])
    norm("model.norm.weight", h)
    dense("lm_head", c["vocab_size"], h)
    path.mkdir(parents=True, exist_ok=True)
    safetensors_io.save(path / "model.safetensors", tensors, dtypes)
    (path / "config.json").write_text(json.dumps(config))
    return path


def write_variant(path, model_type: str, variant: str, seed: int = 0):
    return write_model(path, variant_config(model_type, variant), exl3_codebook="mul1" if variant.startswith("exl3") else None,
                       seed=seed, kv_b_exl3=variant == "exl3_kv_b")


def write_gpu_shaped(path, model_type: str, seed: int = 0):
    """A class B or C checkpoint at the CUDA MLA kernels' shapes (kv_lora_rank 512, a 64-dim rope
    key, index heads of 128) with EXL3 attention, indexer-query and expert projections, whose
    heads (64 + 64 q/k dims, 128 v dims) and 256-wide expert intermediates split into whole
    128-channel EXL3 blocks at tensor parallelism 2."""
    config = {**variant_config(model_type, "plain"), "kv_lora_rank": 512, "qk_nope_head_dim": 64,
              "qk_rope_head_dim": 64, "v_head_dim": 128, "moe_intermediate_size": 256}
    if model_type == "glm_moe_dsa":
        config.update(index_head_dim=128, index_topk=8)
    return write_model(path, config, exl3_codebook="mul1", seed=seed)
