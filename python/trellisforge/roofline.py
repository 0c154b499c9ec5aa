"""What a decode step must read from memory, and the tokens per second a memory bandwidth allows
for it: the roofline bench_engine prints beside its measurements.

Weights count at their stored size: a checkpoint's tensors as its safetensors files hold them
(EXL3 trellis and scales, fp16/bf16 tensors), a synthetic model's as the synthesizer makes them
(zig/src/families/glm/synthetic.zig: every linear EXL3 at `bits`, lm_head at `head_bits`, MLA's
kv_b and the indexer's wk and weights_proj 16-bit as the peer's converter stores them). A layer's
routed experts count as often as the distinct experts a step's rows are expected to pick under
uniform routing, E·(1 − (1 − k/E)^rows); the embedding counts one row per row; multi-token
prediction layers past num_hidden_layers are not run. The KV cache counts what the engine's f32
cache holds for each row's context: GQA's k and v, MLA's latent and rope key (a DSA layer reads its
index_topk selection, and a layer with its own indexer also every position's index key). GLM-5.3-Flash
(`glm5_next`): its KDA layers read and write each row's f32 state (heads x 128 x 128), its NoPE MLA
rows are 576 floats on the GPU as for the other classes, a pooled indexer reads every position's key
and gate scores, and the hyper-connection sites read their f32 mixing matrices.
Everything else (norms, routers, biases, shared experts, lm_head) is read once per step."""
from __future__ import annotations

import json
import pathlib
import re

from . import safetensors_io

_LAYER = re.compile(r"model\.(?:language_model\.)?layers\.(\d+)\.")
_EXPERT = re.compile(r"model\.(?:language_model\.)?layers\.(\d+)\.mlp\.experts\.(\d+)\.")


def checkpoint_modules(model_dir: str | pathlib.Path) -> dict[str, int]:
    """Bytes per module (a tensor's name less its last part) in a checkpoint's safetensors files."""
    root = pathlib.Path(model_dir)
    index = root / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    modules: dict[str, int] = {}
    for file in files:
        header, _ = safetensors_io.read_header(root / file)
        for name, info in header.items():
            if name != "__metadata__":
                begin, end = info["data_offsets"]
                module = name.rsplit(".", 1)[0]
                modules[module] = modules.get(module, 0) + end - begin
    return modules


def exl3_bytes(in_features: int, out_features: int, bits: int, bias: bool = False) -> int:
    """An EXL3 linear as stored: the trellis (bits per weight), suh, svh and the codebook scalar,
    both sides padded to whole 128-channel units (EXL3.md §13: MLA's 576-wide kv_a is stored 640)."""
    k, n = -(-in_features // 128) * 128, -(-out_features // 128) * 128
    return k * n * bits // 8 + 2 * k + 2 * n + 4 + (2 * out_features if bias else 0)


def indexer_layers(config: dict) -> list[bool]:
    """Which layers run their own DSA indexer (the others reuse the previous selection)."""
    layers = config["num_hidden_layers"]
    if "index_topk" not in config:
        return [False] * layers
    kinds = config.get("indexer_types")
    return [kind == "full" for kind in kinds[:layers]] if kinds else [True] * layers


def synthetic_modules(config: dict, bits: int, head_bits: int) -> dict[str, int]:
    """Bytes per module of the model Engine.synthetic makes from `config`."""
    c = config
    h = c["hidden_size"]
    heads = c["num_attention_heads"]
    bias = bool(c.get("attention_bias"))
    modules = {"model.embed_tokens": c["vocab_size"] * h * 2, "model.norm": 2 * h, "lm_head": exl3_bytes(h, c["vocab_size"], head_bits)}
    dense = c.get("mlp_layer_types") or ["dense" if i < c.get("first_k_dense_replace", 0) else "sparse" for i in range(c["num_hidden_layers"])]
    full_indexer = indexer_layers(c)
    next_class = c.get("model_type") == "glm5_next"
    for i in range(c["num_hidden_layers"]):
        at = f"model.layers.{i}."
        modules[at + "input_layernorm"] = modules[at + "post_attention_layernorm"] = 2 * h
        if next_class:
            mixes = (2 + c["hc_mult"]) * c["hc_mult"]
            modules[at + "hc_attn"] = modules[at + "hc_ffn"] = 4 * mixes * (c["hc_mult"] * h + 1) + 12
        if next_class and linear_attention(c)[i]:
            width, head_dim = c["linear_num_heads"] * c["linear_head_dim"], c["linear_head_dim"]
            modules[at + "self_attn.qkv_proj"] = exl3_bytes(h, 3 * width, bits)
            modules[at + "self_attn.conv1d"] = 4 * 3 * width * c["linear_conv_kernel_dim"]
            for name, (k, n) in {"f_a_proj": (h, head_dim), "f_b_proj": (head_dim, width), "g_a_proj": (h, head_dim),
                                 "g_b_proj": (head_dim, width), "b_proj": (h, c["linear_num_heads"])}.items():
                modules[at + "self_attn." + name] = 4 * k * n  # f32 in the synthetic model
            modules[at + "self_attn.o_proj"] = exl3_bytes(width, h, bits)
        elif "kv_lora_rank" in c:
            latent, rope, nope, v = c["kv_lora_rank"], c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"]
            if c.get("q_lora_rank"):
                modules[at + "self_attn.q_a_proj"] = exl3_bytes(h, c["q_lora_rank"], bits, bias)
                modules[at + "self_attn.q_a_layernorm"] = 2 * c["q_lora_rank"]
                modules[at + "self_attn.q_b_proj"] = exl3_bytes(c["q_lora_rank"], heads * (nope + rope), bits)
            else:
                modules[at + "self_attn.q_proj"] = exl3_bytes(h, heads * (nope + rope), bits)
            modules[at + "self_attn.kv_a_proj_with_mqa"] = exl3_bytes(h, latent + rope, bits, bias)
            modules[at + "self_attn.kv_a_layernorm"] = 2 * latent
            modules[at + "self_attn.kv_b_proj"] = 2 * latent * heads * (nope + v)
            modules[at + "self_attn.o_proj"] = exl3_bytes(heads * v, h, bits, bias)
            if full_indexer[i]:
                index_heads, index_dim = c["index_n_heads"], c["index_head_dim"]
                modules[at + "self_attn.indexer.wq_b"] = exl3_bytes(c["q_lora_rank"], index_heads * index_dim, bits)
                modules[at + "self_attn.indexer.wk"] = 2 * index_dim * h
                modules[at + "self_attn.indexer.k_norm"] = 4 * index_dim
                modules[at + "self_attn.indexer.weights_proj"] = 2 * index_heads * h
                if next_class:
                    modules[at + "self_attn.indexer.index_kpool_compress_gate"] = 4 * index_dim * h
        else:
            head_dim, kv_heads = c.get("head_dim") or h // heads, c["num_key_value_heads"]
            modules[at + "self_attn.q_proj"] = exl3_bytes(h, heads * head_dim, bits, bias)
            modules[at + "self_attn.k_proj"] = exl3_bytes(h, kv_heads * head_dim, bits, bias)
            modules[at + "self_attn.v_proj"] = exl3_bytes(h, kv_heads * head_dim, bits, bias)
            modules[at + "self_attn.o_proj"] = exl3_bytes(heads * head_dim, h, bits)
        if dense[i] == "dense":
            for name, (k, n) in {"gate_proj": (h, c["intermediate_size"]), "up_proj": (h, c["intermediate_size"]),
                                 "down_proj": (c["intermediate_size"], h)}.items():
                modules[at + "mlp." + name] = exl3_bytes(k, n, bits)
            continue
        experts, inter = c["n_routed_experts"], c["moe_intermediate_size"]
        modules[at + "mlp.gate"] = 2 * experts * h + 4 * experts
        for e in range(experts):
            for name, (k, n) in {"gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}.items():
                modules[at + f"mlp.experts.{e}.{name}"] = exl3_bytes(k, n, bits)
        shared = inter * c.get("n_shared_experts", 1)
        if shared:
            for name, (k, n) in {"gate_proj": (h, shared), "up_proj": (h, shared), "down_proj": (shared, h)}.items():
                modules[at + "mlp.shared_experts." + name] = exl3_bytes(k, n, bits)
    return modules


def linear_attention(config: dict) -> list[bool]:
    """GLM-5.3-Flash's KDA layers: layer_types, else every layer but each fourth."""
    kinds = config.get("layer_types")
    layers = config["num_hidden_layers"]
    return [kind == "linear_attention" for kind in kinds[:layers]] if kinds else [i % 4 != 3 for i in range(layers)]


def expected_experts(experts: int, per_token: int, rows: int) -> float:
    """Distinct experts `rows` rows pick, each `per_token` of `experts`, under uniform routing."""
    return experts * (1.0 - (1.0 - per_token / experts) ** rows)


# Bytes a cached value takes per KV dtype (the engine's kv_dtype: GQA keys/values and MLA latents;
# the DSA indexer's keys and the KDA state stay f32), and fp8's exponent per position and head.
KV_VALUE_BYTES = {"f32": 4, "f16": 2, "fp8": 1}


def kv_bytes(config: dict, context: int, full_indexer: list[bool], kv_dtype: str = "f32") -> int:
    """The cache one row's attention reads at `context` positions, every layer."""
    c = config
    value = KV_VALUE_BYTES[kv_dtype]
    scale = 1 if kv_dtype == "fp8" else 0
    total = 0
    next_class = c.get("model_type") == "glm5_next"
    for i in range(c["num_hidden_layers"]):
        if next_class and linear_attention(c)[i]:
            total += 2 * 4 * c["linear_num_heads"] * c["linear_head_dim"] ** 2  # the state, read and written
        elif next_class:
            attended = min(context, c["index_topk"] + c["index_kpool"] - 1)
            total += attended * (value * (c["kv_lora_rank"] + 64) + scale)
            if full_indexer[i]:
                total += 4 * context * 2 * c["index_head_dim"]
        elif "kv_lora_rank" in c:
            attended = min(context, c["index_topk"]) if "index_topk" in c else context
            total += attended * (value * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) + scale)
            if full_indexer[i]:
                total += 4 * context * c["index_head_dim"]
        else:
            head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
            total += context * 2 * c["num_key_value_heads"] * (value * head_dim + scale)
    return total


def step_bytes(modules: dict[str, int], config: dict, rows: int, context: int, kv_dtype: str = "f32") -> float:
    """Bytes one decode step of `rows` rows at `context` positions each must read."""
    layers = config["num_hidden_layers"]
    total = 0.0
    experts: dict[int, dict[int, int]] = {}
    for name, size in modules.items():
        layer = _LAYER.match(name)
        if layer and int(layer.group(1)) >= layers:
            continue
        expert = _EXPERT.match(name)
        if expert:
            per_layer = experts.setdefault(int(expert.group(1)), {})
            per_layer[int(expert.group(2))] = per_layer.get(int(expert.group(2)), 0) + size
        elif name == "model.embed_tokens":
            total += rows * size / config["vocab_size"]
        else:
            total += size
    for per_layer in experts.values():
        total += expected_experts(len(per_layer), config["num_experts_per_tok"], rows) * sum(per_layer.values()) / len(per_layer)
    full_indexer = [any(re.match(rf"model\.(?:language_model\.)?layers\.{i}\.self_attn\.indexer\.", name) for name in modules)
                    for i in range(layers)]
    return total + rows * kv_bytes(config, context, full_indexer, kv_dtype)
