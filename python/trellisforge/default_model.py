"""Builds the built-in default model, bit for bit the same every time:

    python -m trellisforge.default_model [OUT_DIR]      (default: models/default in the repository)

A GLM-4.5-shaped (`Glm4MoeForCausalLM`) model with deterministic random weights: hidden 256, one
dense and one MoE layer (8 experts, top 2, a shared expert), the GLM tokenizer of the test fixture
(byte-level BPE, 2048 tokens, GLM's special tokens), a GLM-4.5-style chat template with tools and
thinking, quantized by our own quantizer to 3-bit MUL1 EXL3 (lm_head 6-bit). It talks nonsense; it
exists so that `python -m server` runs out of the box and its whole pipeline is exercised."""
from __future__ import annotations

import json
import pathlib
import shutil
import sys
import tempfile

import numpy as np

from . import safetensors_io
from .quantize import quantize

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOKENIZER_SOURCE = ROOT / "tests" / "fixtures" / "glm4_moe" / "exl3_3.0bpw"
TEMPLATE = pathlib.Path(__file__).resolve().parent / "templates" / "glm45.jinja"
SEED = 20261129
CONFIG = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128, "partial_rotary_factor": 0.5,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-5, "attention_bias": True, "use_qk_norm": False, "vocab_size": 2048,
    "intermediate_size": 512, "moe_intermediate_size": 128, "n_routed_experts": 8, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "tie_word_embeddings": False, "max_position_embeddings": 4096, "hidden_act": "silu",
    "eos_token_id": [0, 7, 9], "pad_token_id": 0,
}


def write_source(directory: pathlib.Path) -> None:
    """The unquantized model: bf16 weights from one seeded generator, in a fixed order."""
    c = CONFIG
    rng = np.random.default_rng(SEED)
    h, d = c["hidden_size"], c["head_dim"]

    def bf16(shape, scale, offset=0.0):
        values = (offset + rng.standard_normal(shape) * scale).astype(np.float32)
        return (values.view(np.uint32) >> 16).astype(np.uint16)

    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": bf16((c["vocab_size"], h), 1.0)}
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        tensors[f"{p}.input_layernorm.weight"] = bf16((h,), 0.1, 1.0)
        tensors[f"{p}.post_attention_layernorm.weight"] = bf16((h,), 0.1, 1.0)
        for name, out_features, in_features in (("q_proj", c["num_attention_heads"] * d, h), ("k_proj", c["num_key_value_heads"] * d, h),
                                                ("v_proj", c["num_key_value_heads"] * d, h), ("o_proj", h, c["num_attention_heads"] * d)):
            tensors[f"{p}.self_attn.{name}.weight"] = bf16((out_features, in_features), in_features ** -0.5)
            if name != "o_proj":
                tensors[f"{p}.self_attn.{name}.bias"] = bf16((out_features,), 0.02)
        mlps = [(f"{p}.mlp", c["intermediate_size"])] if layer < c["first_k_dense_replace"] else \
            [(f"{p}.mlp.experts.{e}", c["moe_intermediate_size"]) for e in range(c["n_routed_experts"])] + [(f"{p}.mlp.shared_experts", c["moe_intermediate_size"])]
        if layer >= c["first_k_dense_replace"]:
            tensors[f"{p}.mlp.gate.weight"] = bf16((c["n_routed_experts"], h), h ** -0.5)
            tensors[f"{p}.mlp.gate.e_score_correction_bias"] = np.zeros(c["n_routed_experts"], dtype=np.float32)
        for prefix, intermediate in mlps:
            tensors[f"{prefix}.gate_proj.weight"] = bf16((intermediate, h), h ** -0.5)
            tensors[f"{prefix}.up_proj.weight"] = bf16((intermediate, h), h ** -0.5)
            tensors[f"{prefix}.down_proj.weight"] = bf16((h, intermediate), intermediate ** -0.5)
    tensors["model.norm.weight"] = bf16((h,), 0.1, 1.0)
    tensors["lm_head.weight"] = bf16((c["vocab_size"], h), h ** -0.5)
    dtypes = {name: ("F32" if array.dtype == np.float32 else "BF16") for name, array in tensors.items()}
    safetensors_io.save(directory / "model.safetensors", tensors, dtypes)
    (directory / "config.json").write_text(json.dumps(c, indent=2))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": c["eos_token_id"], "pad_token_id": 0}, indent=2))
    for name in ("tokenizer.json", "special_tokens_map.json"):
        shutil.copyfile(TOKENIZER_SOURCE / name, directory / name)
    tokenizer_config = json.loads((TOKENIZER_SOURCE / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)  # chat_template.jinja is the template
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    shutil.copyfile(TEMPLATE, directory / "chat_template.jinja")


def build(out_dir: pathlib.Path, progress: bool = True) -> pathlib.Path:
    with tempfile.TemporaryDirectory() as scratch:
        source = pathlib.Path(scratch) / "source"
        source.mkdir()
        write_source(source)
        quantize(source, out_dir, bits=3, head_bits=6, codebook="mul1", seed=SEED, overwrite=True, progress=progress)
    return out_dir


if __name__ == "__main__":
    target = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "models" / "default"
    if target.is_symlink():
        target.unlink()
    build(target)
    print(f"wrote {target}")
