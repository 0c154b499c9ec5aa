"""Full-size EXL3 checkpoints with random weights, for benchmarks and load tests:

    python -m trellisforge.synthesize SHAPE OUT_DIR [--bits 3] [--head-bits 6] [--shard-gb 4]

Trellis words are uniform random (they decode to the codebook's distribution), signs random, scales
chosen so activations stay O(1); norms, router and embeddings are plausible bf16/fp16/fp32 values.
Nothing is quantized. Tensors are generated and written one at a time into shards with an index, so
memory stays bounded whatever the size. Shapes follow shared/GLM.md §2.1 and §6.3 (the `-tp2-rankR`
shapes are one rank's slice at tensor parallelism 2, EXL3 channels split on 128 boundaries)."""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

import numpy as np
from tqdm import tqdm

from .quantize import MARKERS
from .st_writer import OutputDirectory, ShardWriter

BASE_SHAPES = {
    "glm-4.5": dict(hidden_size=5120, num_hidden_layers=92, num_attention_heads=96, num_key_value_heads=8, head_dim=128,
                    intermediate_size=12288, moe_intermediate_size=1536, n_routed_experts=160, num_experts_per_tok=8,
                    first_k_dense_replace=3, routed_scaling_factor=2.5, use_qk_norm=True, vocab_size=151552,
                    max_position_embeddings=131072),
    "glm-4.5-air": dict(hidden_size=4096, num_hidden_layers=46, num_attention_heads=96, num_key_value_heads=8, head_dim=128,
                        intermediate_size=10944, moe_intermediate_size=1408, n_routed_experts=128, num_experts_per_tok=8,
                        first_k_dense_replace=1, routed_scaling_factor=1.0, use_qk_norm=False, vocab_size=151552,
                        max_position_embeddings=131072),
    # GLM-4.7-Flash and GLM-5 (GLM.md §2.2, §2.3): multi-head latent attention, GLM-5 with the DSA
    # indexer. In memory only (Engine.synthetic); the file writer below writes class A.
    "glm-4.7-flash": dict(architectures=["Glm4MoeLiteForCausalLM"], model_type="glm4_moe_lite", hidden_size=2048,
                          num_hidden_layers=47, num_attention_heads=20, num_key_value_heads=20, q_lora_rank=768,
                          kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256, rope_interleave=True,
                          intermediate_size=10240, moe_intermediate_size=1536, n_routed_experts=64, num_experts_per_tok=4,
                          first_k_dense_replace=1, routed_scaling_factor=1.8, attention_bias=False, vocab_size=154880,
                          max_position_embeddings=202752, partial_rotary_factor=1.0, eos_token_id=[154820, 154827, 154829]),
    "glm-5": dict(architectures=["GlmMoeDsaForCausalLM"], model_type="glm_moe_dsa", hidden_size=6144, num_hidden_layers=78,
                  num_attention_heads=64, num_key_value_heads=64, q_lora_rank=2048, kv_lora_rank=512, qk_nope_head_dim=192,
                  qk_rope_head_dim=64, v_head_dim=256, index_n_heads=32, index_head_dim=128, index_topk=2048,
                  intermediate_size=12288, moe_intermediate_size=2048, n_routed_experts=256, num_experts_per_tok=8,
                  first_k_dense_replace=3, routed_scaling_factor=2.5, attention_bias=False, vocab_size=154880,
                  max_position_embeddings=202752, partial_rotary_factor=1.0, eos_token_id=[154820, 154827, 154829]),
    # GLM-5.3-Flash (GLM.md §2.4, transformers' Glm5NextTextConfig defaults): KDA on 3 of every 4
    # layers, NoPE MLA with the pooled DSA indexer on the 4th, 4 hyper-connection streams.
    "glm-5.3-flash": dict(architectures=["Glm5NextForConditionalGeneration"], model_type="glm5_next", hidden_size=4096,
                          num_hidden_layers=45, num_attention_heads=64, num_key_value_heads=64, q_lora_rank=1536,
                          kv_lora_rank=512, qk_nope_head_dim=256, qk_rope_head_dim=0, v_head_dim=256, index_n_heads=32,
                          index_head_dim=128, index_topk=2048, index_kpool=4, index_kpool_always_select_tail=True,
                          linear_num_heads=64, linear_head_dim=128, linear_conv_kernel_dim=4, linear_lower_bound=-5.0,
                          hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=10.0, intermediate_size=12288,
                          moe_intermediate_size=2048, n_routed_experts=288, num_experts_per_tok=8, first_k_dense_replace=3,
                          routed_scaling_factor=2.5, attention_bias=False, vocab_size=154880, max_position_embeddings=1048576,
                          eos_token_id=[154820, 154827, 154829]),
    # A small shape with the same structure, for tests on machines without much disk.
    "tiny": dict(hidden_size=256, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 intermediate_size=512, moe_intermediate_size=128, n_routed_experts=8, num_experts_per_tok=2,
                 first_k_dense_replace=1, routed_scaling_factor=2.5, use_qk_norm=True, vocab_size=1024,
                 max_position_embeddings=4096),
}
COMMON = dict(architectures=["Glm4MoeForCausalLM"], model_type="glm4_moe", partial_rotary_factor=0.5, rope_theta=1e6,
              rms_norm_eps=1e-5, attention_bias=True, n_shared_experts=1, n_group=1, topk_group=1, norm_topk_prob=True,
              tie_word_embeddings=False, hidden_act="silu", eos_token_id=[151329, 151336, 151338])


def split_units(size: int, world: int, rank: int) -> int:
    """EXL3 splits on 128-channel units (EXL3.md §13): padded size in units, uneven ranks get one less."""
    units = -(-size // 128)
    per_rank = [units // world + (1 if r < units % world else 0) for r in range(world)]
    return per_rank[rank] * 128


def shape_config(name: str) -> dict:
    """`SHAPE[-tp2-rankR][-NNl]`: a named shape, optionally one rank's TP=2 slice, optionally cut to
    NN layers (the first_k_dense_replace dense ones first) for benchmarks of a few full-size layers."""
    layers = None
    cut = re.search(r"-(\d+)l$", name)
    if cut:
        layers, name = int(cut.group(1)), name[: cut.start()]
    config = _shape_config(name)
    if layers is not None:
        if not 1 <= layers <= config["num_hidden_layers"]:
            raise ValueError(f"a cut to {layers} layers is outside 1..{config['num_hidden_layers']}")
        config["num_hidden_layers"] = layers
        config["first_k_dense_replace"] = min(config["first_k_dense_replace"], layers)
        if "mlp_layer_types" in config:
            config["mlp_layer_types"] = config["mlp_layer_types"][:layers]
        if config.get("model_type") == "glm5_next":
            # The cut keeps the class's schedules: every 4th layer DSA; its dense layers first.
            config["mlp_layer_types"] = ["dense" if i < config["first_k_dense_replace"] else "sparse" for i in range(layers)]
    return config


def _shape_config(name: str) -> dict:
    base, _, tp = name.partition("-tp2-rank")
    if base not in BASE_SHAPES or (tp and tp not in ("0", "1")):
        raise ValueError(f"unknown shape '{name}'; known: {', '.join(shape_names())}")
    config = {**COMMON, **BASE_SHAPES[base]}
    if tp:
        rank = int(tp)
        config.update(num_attention_heads=config["num_attention_heads"] // 2, num_key_value_heads=config["num_key_value_heads"] // 2,
                      intermediate_size=split_units(config["intermediate_size"], 2, rank),
                      moe_intermediate_size=split_units(config["moe_intermediate_size"], 2, rank),
                      trellisforge_tensor_parallel={"world": 2, "rank": rank, "source_shape": base})
    return config


def shape_names() -> list[str]:
    return [n for b in BASE_SHAPES for n in (b, f"{b}-tp2-rank0", f"{b}-tp2-rank1")]


def plan_tensors(config: dict, bits: int, head_bits: int, codebook: str):
    """(name, dtype, shape, maker) for every tensor, in writing order."""
    c = config
    if c["model_type"] != "glm4_moe":
        raise ValueError(f"checkpoint files of {c['architectures'][0]} shapes are not written; use Engine.synthetic")
    h, d = c["hidden_size"], c["head_dim"]
    entries = [("model.embed_tokens.weight", "BF16", (c["vocab_size"], h), ("normal", 0.02))]

    def linear(prefix, in_features, out_features, k, bias=False):
        k_p, n_p = -(-in_features // 128) * 128, -(-out_features // 128) * 128
        entries.extend([
            (f"{prefix}.trellis", "I16", (k_p // 16, n_p // 16, 16 * k), ("words",)),
            (f"{prefix}.suh", "F16", (k_p,), ("signs", 1.0)),
            (f"{prefix}.svh", "F16", (n_p,), ("signs", 1.0 / np.sqrt(in_features))),
        ])
        if codebook in MARKERS:
            entries.append((f"{prefix}.{codebook}", "I32", (), ("marker", MARKERS[codebook])))
        if bias:
            entries.append((f"{prefix}.bias", "F16", (n_p,), ("normal", 0.02)))

    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        entries += [(f"{p}.input_layernorm.weight", "BF16", (h,), ("ones",)),
                    (f"{p}.post_attention_layernorm.weight", "BF16", (h,), ("ones",))]
        linear(f"{p}.self_attn.q_proj", h, c["num_attention_heads"] * d, bits, bias=True)
        linear(f"{p}.self_attn.k_proj", h, c["num_key_value_heads"] * d, bits, bias=True)
        linear(f"{p}.self_attn.v_proj", h, c["num_key_value_heads"] * d, bits, bias=True)
        linear(f"{p}.self_attn.o_proj", c["num_attention_heads"] * d, h, bits)
        if c["use_qk_norm"]:
            entries += [(f"{p}.self_attn.q_norm.weight", "BF16", (d,), ("ones",)),
                        (f"{p}.self_attn.k_norm.weight", "BF16", (d,), ("ones",))]
        mlps = [(f"{p}.mlp", c["intermediate_size"])] if layer < c["first_k_dense_replace"] else \
            [(f"{p}.mlp.experts.{e}", c["moe_intermediate_size"]) for e in range(c["n_routed_experts"])] + \
            [(f"{p}.mlp.shared_experts", c["moe_intermediate_size"])]
        if layer >= c["first_k_dense_replace"]:
            entries += [(f"{p}.mlp.gate.weight", "F16", (c["n_routed_experts"], h), ("normal", 0.02)),
                        (f"{p}.mlp.gate.e_score_correction_bias", "F32", (c["n_routed_experts"],), ("normal", 0.01))]
        for prefix, intermediate in mlps:
            linear(f"{prefix}.gate_proj", h, intermediate, bits)
            linear(f"{prefix}.up_proj", h, intermediate, bits)
            linear(f"{prefix}.down_proj", intermediate, h, bits)
    entries.append(("model.norm.weight", "BF16", (h,), ("ones",)))
    linear("lm_head", h, c["vocab_size"], head_bits)
    return entries


def make(kind, dtype: str, shape, rng: np.random.Generator) -> np.ndarray:
    if kind[0] == "words":
        return rng.integers(-32768, 32768, size=shape, dtype=np.int16)
    if kind[0] == "marker":
        return np.array(kind[1], dtype=np.int32)
    if kind[0] == "ones":
        values = np.ones(shape, dtype=np.float32) + rng.standard_normal(shape, dtype=np.float32) * 0.05
    elif kind[0] == "signs":
        values = np.where(rng.random(shape) < 0.5, -1.0, 1.0).astype(np.float32) * kind[1] * (0.75 + 0.5 * rng.random(shape, dtype=np.float32))
    else:
        values = rng.standard_normal(shape, dtype=np.float32) * kind[1]
    if dtype == "BF16":
        return (values.view(np.uint32) >> 16).astype(np.uint16)
    return values.astype({"F16": np.float16, "F32": np.float32}[dtype])


def synthesize(shape: str, out_dir, bits: int = 3, head_bits: int = 6, codebook: str = "mul1", seed: int = 0,
               shard_bytes: int = 4 << 30, overwrite: bool = False, progress: bool = True) -> pathlib.Path:
    config = shape_config(shape)
    config["quantization_config"] = {"quant_method": "exl3", "version": "trellisforge-synthetic", "bits": float(bits),
                                     "head_bits": head_bits, "calibration": {"rows": 0, "cols": 0}, "codebook": codebook,
                                     "out_scales": "never"}
    entries = plan_tensors(config, bits, head_bits, codebook)
    sizes = [np.dtype({"I16": np.int16, "F16": np.float16, "BF16": np.uint16, "F32": np.float32, "I32": np.int32}[dt]).itemsize
             * int(np.prod(s, dtype=np.int64)) for _, dt, s, _ in entries]
    shards, current, current_bytes = [], [], 0
    for entry, size in zip(entries, sizes):
        if current and current_bytes + size > shard_bytes:
            shards.append(current)
            current, current_bytes = [], 0
        current.append(entry)
        current_bytes += size
    shards.append(current)
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    rng = np.random.default_rng(seed)
    out = pathlib.Path(out_dir)
    with OutputDirectory(out, overwrite=overwrite) as partial:
        bar = tqdm(total=sum(sizes), unit="B", unit_scale=True, disable=not progress, desc=shape)
        for name, shard in zip(names, shards):
            writer = ShardWriter(partial / name, [(n, dt, s) for n, dt, s, _ in shard], metadata={"format": "pt"})
            try:
                for n, dt, s, kind in shard:
                    array = make(kind, dt, s, rng)
                    writer.write(n, array)
                    bar.update(array.nbytes)
                writer.close()
            except BaseException:
                writer.abort()
                raise
        bar.close()
        weight_map = {n: name for name, shard in zip(names, shards) for n, _, _, _ in shard}
        (partial / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}, indent=1))
        (partial / "config.json").write_text(json.dumps(config, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trellisforge.synthesize", description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", help=f"one of {', '.join(shape_names())}, optionally with -NNl (first NN layers)")
    parser.add_argument("out_dir")
    parser.add_argument("--bits", type=int, default=3, choices=range(1, 9))
    parser.add_argument("--head-bits", type=int, default=6, choices=range(1, 9))
    parser.add_argument("--codebook", default="mul1", choices=["mul1", "mcg", "3inst"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard-gb", type=float, default=4.0)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    try:
        synthesize(args.shape, args.out_dir, args.bits, args.head_bits, args.codebook, args.seed,
                   int(args.shard_gb * (1 << 30)), args.overwrite)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
