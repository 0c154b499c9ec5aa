"""Decode-step time of full-size layers, as a table (a benchmark, not a test):

    python -m trellisforge.bench_layers DIR_A DIR_B [--backend cuda] [--steps 32]

DIR_A and DIR_B are synthetic checkpoints of the same shape cut to different layer counts
(`python -m trellisforge.synthesize glm-4.5-air-2l ...` and `-4l`); the difference of their decode
step times divided by the difference of their MoE layers is the time of one MoE layer, against the
bytes that layer must read at M = 1 (attention, router, the shared and top-k experts' trellis and
scales)."""
from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np

from . import Engine, Sampling


def layer_bytes(config: dict, bits: int) -> float:
    """Bytes one MoE layer reads per decoded token at M = 1."""
    h, d = config["hidden_size"], config["head_dim"]
    attention = h * (config["num_attention_heads"] * d * 2 + config["num_key_value_heads"] * d * 2)
    expert = 3 * h * config["moe_intermediate_size"]
    weights = attention + (config["num_experts_per_tok"] + config.get("n_shared_experts", 1)) * expert
    return weights * bits / 8 + 4 * config["n_routed_experts"] * h  # trellis, plus the f32 router


def step_time_ms(directory: str, backend: str, steps: int) -> float:
    engine = Engine(directory, backend=backend, max_seqs=1, ctx=512)
    prompt = [int(t) for t in np.random.default_rng(0).integers(10, 1000, 8)]
    engine.add(prompt, Sampling(max_tokens=steps + 4), stop_token_ids=[])
    for _ in range(3):  # prefill and warm-up
        engine.step()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir_a")
    parser.add_argument("dir_b")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--copy-gbs", type=float, default=0.0, help="measured copy bandwidth, GB/s, for the % column")
    args = parser.parse_args()
    configs = [json.loads((pathlib.Path(d) / "config.json").read_text()) for d in (args.dir_a, args.dir_b)]
    moe = [c["num_hidden_layers"] - c["first_k_dense_replace"] for c in configs]
    times = [step_time_ms(d, args.backend, args.steps) for d in (args.dir_a, args.dir_b)]
    per_layer_ms = (times[1] - times[0]) / (moe[1] - moe[0])
    bits = int(configs[0]["quantization_config"]["bits"])
    gb = layer_bytes(configs[0], bits) / 1e9
    print(f"{'model':<34} {'MoE layers':>10} {'step ms':>9}")
    for d, m, t in zip((args.dir_a, args.dir_b), moe, times):
        print(f"{pathlib.Path(d).name:<34} {m:>10} {t:>9.3f}")
    achieved = gb / (per_layer_ms * 1e-3)
    share = f", {100 * achieved / args.copy_gbs:.1f}% of {args.copy_gbs:.0f} GB/s copy" if args.copy_gbs else ""
    print(f"one MoE layer at M=1: {per_layer_ms * 1e3:.1f} us for {gb * 1e3:.1f} MB of weights -> {achieved:.0f} GB/s{share}")


if __name__ == "__main__":
    main()
