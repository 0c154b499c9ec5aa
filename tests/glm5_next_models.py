"""Small random glm5_next (GLM-5.3-Flash) checkpoints for the tests: config.json with a
`text_config` shaped like the fixture's (../shared/fixtures/glm5_next/exl3_3.0bpw), model.safetensors
unquantized with the fixture's f32/f16/bf16 mix. Three tensor-name forms: "peer" (the checkpoint's own
names as the peer stores them: hc_attn_fn, self_attn.A_log, fused qkv_proj), "hf_split" (the same
with q/k/v_proj and q/k/v_conv1d separate) and "hf_modules" (transformers' module names under a plain
`model.` prefix: attn_hc.fn, forget_gate.*, fused experts.gate_up_proj). The variants cover what the
fixture does not: the softplus forget gate, no tail, k-pools of 1 and 2, a shared indexer layer, two
hyper-connection streams, group-limited routing, transformers' default layer schedules."""
from __future__ import annotations

import json

import numpy as np

from trellisforge import safetensors_io
from trellisforge.reference import glm5_next

BASE = {
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": [0], "pad_token_id": 0,
    "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
    "num_hidden_layers": 4, "layer_types": ["linear_attention", "deepseek_sparse_attention",
                                            "linear_attention", "deepseek_sparse_attention"],
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"], "indexer_types": ["full"] * 4,
    "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 32,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 0, "qk_head_dim": 32, "v_head_dim": 32, "head_dim": 0,
    "index_head_dim": 32, "index_n_heads": 2, "index_topk": 16, "index_kpool": 4,
    "index_kpool_always_select_tail": True,
    "linear_attn_config": {"gate_lower_bound": -5.0, "head_dim": 32, "num_heads": 2, "short_conv_kernel_size": 4},
    "linear_conv_kernel_dim": 4, "linear_head_dim": 32, "linear_lower_bound": -5.0, "linear_num_heads": 2,
    "hc_eps": 1e-6, "hc_mult": 4, "hc_sinkhorn_iters": 20, "first_k_dense_replace": 1,
    "n_group": 1, "topk_group": 1, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "swiglu_limit": 2.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 512, "num_nextn_predict_layers": 1,
    "tie_word_embeddings": False, "vocab_size": 300, "model_type": "glm5_next_text",
}
VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 64,
          "projection_intermediate_size": 32, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
          "model_type": "glm5_next_vision"}
VARIANTS = {
    "base": {},
    "hf_split": {},
    "hf_modules": {},
    # Both must be null and safe_gate false: a null gate_lower_bound alone is still -5.0.
    "softplus_gate": {"linear_lower_bound": None,
                      "linear_attn_config": {"gate_lower_bound": None, "safe_gate": False, "head_dim": 32,
                                             "num_heads": 2, "short_conv_kernel_size": 4}},
    "no_tail": {"index_kpool_always_select_tail": False},
    "kpool_1": {"index_kpool": 1},
    "kpool_2": {"index_kpool": 2, "index_topk": 12},
    "shared_indexer": {"num_hidden_layers": 5,
                       "layer_types": ["linear_attention", "deepseek_sparse_attention", "deepseek_sparse_attention",
                                       "linear_attention", "deepseek_sparse_attention"],
                       "mlp_layer_types": ["dense", "sparse", "sparse", "sparse", "sparse"],
                       "indexer_types": ["full", "full", "shared", "full", "full"]},
    "hc_mult_2": {"hc_mult": 2},
    "hc_mult_1": {"hc_mult": 1},
    "head_dims_64": {"linear_head_dim": 64, "index_head_dim": 64, "qk_nope_head_dim": 64, "v_head_dim": 64,
                     "linear_attn_config": {"gate_lower_bound": -5.0, "head_dim": 64, "num_heads": 2, "short_conv_kernel_size": 4}},
    "group_limited_routing": {"n_routed_experts": 8, "n_group": 4, "topk_group": 2, "num_experts_per_tok": 3},
    # transformers' schedules: layers 0-2 dense whatever first_k_dense_replace says, every 4th layer DSA.
    "default_schedules": {"layer_types": None, "mlp_layer_types": None, "indexer_types": None},
}
FORMS = {"hf_split": "hf_split", "hf_modules": "hf_modules"}
PROMPT_LENGTH = 72  # over transformers' 64-token KDA chunk, and 4.5 x index_topk: the selection is sparse


def variant_config(variant: str) -> dict:
    text = {**BASE, **VARIANTS[variant]}
    return {"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
            "text_config": text, "vision_config": VISION, "tie_word_embeddings": False,
            "image_token_id": 1000, "video_token_id": 1001, "image_start_token_id": 1002, "image_end_token_id": 1003,
            "video_start_token_id": 1004, "video_end_token_id": 1005}


def prompt(config: dict, seed: int = 6, length: int = PROMPT_LENGTH) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, config["text_config"]["vocab_size"], length)]


def random_tensors(c: dict, rng: np.random.Generator) -> tuple[dict, dict]:
    """Tensors under transformers' module names (`model.language_model.`), per-expert experts, q/k/v
    separate, and their safetensors dtypes ("BF16" for uint16 bits)."""
    tensors, dtypes = {}, {}
    h, hc = c["hidden_size"], c["hc_mult"]
    width, heads = c["linear_num_heads"] * c["linear_head_dim"], c["num_attention_heads"]

    def put(name, values, dtype=np.float32):
        values = np.asarray(values, dtype=np.float32)
        if dtype == "BF16":
            tensors[name], dtypes[name] = (values.view(np.uint32) >> 16).astype(np.uint16), "BF16"
        else:
            tensors[name] = values.astype(dtype)

    def dense(name, out_features, in_features, dtype=np.float32, scale=1.0):
        put(f"{name}.weight", rng.standard_normal((out_features, in_features)) * scale / np.sqrt(in_features), dtype)

    def norm(name, size):
        put(name, 1 + 0.1 * rng.standard_normal(size), "BF16")

    def mlp(prefix, intermediate):
        dense(f"{prefix}.gate_proj", intermediate, h)
        dense(f"{prefix}.up_proj", intermediate, h)
        dense(f"{prefix}.down_proj", h, intermediate)

    m = "model.language_model"
    put(f"{m}.embed_tokens.weight", rng.standard_normal((c["vocab_size"], h)), "BF16")
    for layer in range(c["num_hidden_layers"] + 1):  # + the MTP layer, which the reference skips
        p, a = f"{m}.layers.{layer}", f"{m}.layers.{layer}.self_attn"
        if layer == c["num_hidden_layers"]:
            dense(f"{p}.eh_proj", h, 2 * h)
            norm(f"{p}.enorm.weight", h)
            break
        for site in ("attn_hc", "ffn_hc"):
            put(f"{p}.{site}.fn", rng.standard_normal(((2 + hc) * hc, hc * h)) / np.sqrt(hc * h))
            put(f"{p}.{site}.base", 0.5 * rng.standard_normal((2 + hc) * hc))
            put(f"{p}.{site}.scale", 1 + 0.3 * rng.standard_normal(3))
        norm(f"{p}.input_layernorm.weight", h)
        norm(f"{p}.post_attention_layernorm.weight", h)
        if c["layer_types"][layer] == "linear_attention":
            dim = c["linear_head_dim"]
            for proj in "qkv":
                dense(f"{a}.{proj}_proj", width, h)
            put(f"{a}.conv1d.weight", 0.5 * rng.standard_normal((3 * width, 1, c["linear_conv_kernel_dim"])))
            f = f"{a}.forget_gate"
            dense(f"{f}.f_a_proj", dim, h, np.float16)
            dense(f"{f}.f_b_proj", width, dim, np.float16)
            put(f"{f}.dt_bias", 0.5 * rng.standard_normal(width))
            # log decay rates 0.3 .. 1.5: moderate decays keep transformers' fp32 cumsum of g exact enough
            put(f"{f}.A_log", np.log(rng.uniform(0.3, 1.5, c["linear_num_heads"])))
            dense(f"{a}.b_proj", c["linear_num_heads"], h, np.float16)
            dense(f"{a}.g_a_proj", dim, h, np.float16)
            dense(f"{a}.g_b_proj", width, dim, np.float16)
            norm(f"{a}.o_norm.weight", dim)
            dense(f"{a}.o_proj", h, width)
        else:
            nope, v = c["qk_nope_head_dim"], c["v_head_dim"]
            dense(f"{a}.q_a_proj", c["q_lora_rank"], h)
            norm(f"{a}.q_a_layernorm.weight", c["q_lora_rank"])
            dense(f"{a}.q_b_proj", heads * nope, c["q_lora_rank"])
            dense(f"{a}.kv_a_proj_with_mqa", c["kv_lora_rank"], h)
            norm(f"{a}.kv_a_layernorm.weight", c["kv_lora_rank"])
            dense(f"{a}.kv_b_proj", heads * (nope + v), c["kv_lora_rank"], np.float16)
            dense(f"{a}.o_proj", h, heads * v)
            if c["indexer_types"][layer] == "full":
                i, dim = f"{a}.indexer", c["index_head_dim"]
                dense(f"{i}.wq_b", c["index_n_heads"] * dim, c["q_lora_rank"])
                dense(f"{i}.wk", dim, h, np.float16)
                put(f"{i}.k_norm.weight", 1 + 0.1 * rng.standard_normal(dim), np.float16)
                put(f"{i}.k_norm.bias", 0.1 * rng.standard_normal(dim), np.float16)
                dense(f"{i}.weights_proj", c["index_n_heads"], h, np.float16)
                put(f"{i}.index_kpool_compress_ape", 0.5 * rng.standard_normal((c["index_kpool"], dim)))
                put(f"{i}.index_kpool_compress_gate", rng.standard_normal((dim, h)) / np.sqrt(h), np.float16)
        if c["mlp_layer_types"][layer] == "dense":
            mlp(f"{p}.mlp", c["intermediate_size"])
            continue
        dense(f"{p}.mlp.gate", c["n_routed_experts"], h, np.float16, scale=2.0)
        put(f"{p}.mlp.gate.e_score_correction_bias", 0.05 * rng.standard_normal(c["n_routed_experts"]))
        for e in range(c["n_routed_experts"]):
            mlp(f"{p}.mlp.experts.{e}", c["moe_intermediate_size"])
        mlp(f"{p}.mlp.shared_experts", c["moe_intermediate_size"] * c["n_shared_experts"])
    norm(f"{m}.norm.weight", h)
    dense("lm_head", c["vocab_size"], h)
    put("model.visual.patch_embed.proj.weight", rng.standard_normal((4, 4)))  # skipped by the reference
    return tensors, dtypes


def in_form(tensors: dict, dtypes: dict, form: str) -> tuple[dict, dict]:
    """Renames transformers' module names into a stored form (see the module docstring)."""
    out, types = {}, {}
    for name, value in tensors.items():
        key = name
        if form == "hf_modules":
            key = key.replace("model.language_model.", "model.")
        else:
            key = key.replace(".self_attn.forget_gate.", ".self_attn.")
            for site in ("attn", "ffn"):
                for part in ("fn", "base", "scale"):
                    key = key.replace(f".{site}_hc.{part}", f".hc_{site}_{part}")
        out[key] = value
        if name in dtypes:
            types[key] = dtypes[name]
    for key in [k for k in out if k.endswith(".self_attn.q_proj.weight")]:
        base = key[:-len("q_proj.weight")]
        if form == "peer":
            out[f"{base}qkv_proj.weight"] = np.concatenate([out.pop(f"{base}{p}_proj.weight") for p in "qkv"])
        if form == "hf_split":
            conv = out.pop(f"{base}conv1d.weight")
            for i, p in enumerate(np.split(conv, 3)):
                out[f"{base}{'qkv'[i]}_conv1d.weight"] = p
    if form == "hf_modules":
        for key in [k for k in out if k.endswith(".mlp.experts.0.gate_proj.weight")]:
            base = key[:-len("0.gate_proj.weight")]
            count = len([k for k in out if k.startswith(base) and k.endswith(".gate_proj.weight")])
            out[f"{base}gate_up_proj"] = np.stack([
                np.concatenate([out.pop(f"{base}{e}.gate_proj.weight"), out.pop(f"{base}{e}.up_proj.weight")])
                for e in range(count)])
            out[f"{base}down_proj"] = np.stack([out.pop(f"{base}{e}.down_proj.weight") for e in range(count)])
    return out, types


def write_model(path, config: dict, form: str = "peer", seed: int = 0):
    c = glm5_next.text_config(config)
    tensors, dtypes = in_form(*random_tensors(c, np.random.default_rng(seed)), form)
    path.mkdir(parents=True, exist_ok=True)
    safetensors_io.save(path / "model.safetensors", tensors, dtypes)
    (path / "config.json").write_text(json.dumps(config))
    return path


def write_variant(path, variant: str, seed: int = 0):
    return write_model(path, variant_config(variant), FORMS.get(variant, "peer"), seed)
