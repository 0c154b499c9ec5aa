"""Decode-step time of full-size layers, as a table (a benchmark, not a test):

    python -m trellisforge.bench_layers DIR_A DIR_B [--backend cuda] [--steps 32]
    python -m trellisforge.bench_layers --synthetic glm-4.5-air-2l glm-4.5-air-4l [--bits 3]

DIR_A and DIR_B are synthetic checkpoints of the same shape cut to different layer counts
(`python -m trellisforge.synthesize glm-4.5-air-2l ...` and `-4l`), or with --synthetic the shape
names themselves (the weights made in memory, no files); the difference of their decode
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


def step_time_ms(engine: Engine, steps: int) -> float:
    prompt = [int(t) for t in np.random.default_rng(0).integers(10, 1000, 8)]
    engine.add(prompt, Sampling(max_tokens=steps + 4), stop_token_ids=[])
    for _ in range(3):  # prefill and warm-up
        engine.step()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return (time.perf_counter() - start) / steps * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir_a")
    parser.add_argument("dir_b")
    parser.add_argument("--synthetic", action="store_true", help="DIR_A and DIR_B are synthesize shape names")
    parser.add_argument("--bits", type=int, default=3, help="with --synthetic: trellis bits per weight")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--copy-gbs", type=float, default=0.0, help="measured copy bandwidth, GB/s, for the % column")
    args = parser.parse_args(argv)
    if args.synthetic:
        from .synthesize import shape_config
        configs = [shape_config(name) for name in (args.dir_a, args.dir_b)]
        bits = args.bits

        def open_engine(name: str) -> Engine:
            return Engine.synthetic(name, bits=bits, backend=args.backend, max_seqs=1, ctx=512)
    else:
        configs = [json.loads((pathlib.Path(d) / "config.json").read_text()) for d in (args.dir_a, args.dir_b)]
        bits = int(configs[0]["quantization_config"]["bits"])

        def open_engine(directory: str) -> Engine:
            return Engine(directory, backend=args.backend, max_seqs=1, ctx=512)
    moe = [c["num_hidden_layers"] - c["first_k_dense_replace"] for c in configs]
    times = []
    for name in (args.dir_a, args.dir_b):
        engine = open_engine(name)
        times.append(step_time_ms(engine, args.steps))
        engine.close()
    per_layer_ms = (times[1] - times[0]) / (moe[1] - moe[0])
    gb = layer_bytes(configs[0], bits) / 1e9
    print(f"{'model':<34} {'MoE layers':>10} {'step ms':>9}")
    for d, m, t in zip((args.dir_a, args.dir_b), moe, times):
        print(f"{pathlib.Path(d).name:<34} {m:>10} {t:>9.3f}")
    achieved = gb / (per_layer_ms * 1e-3)
    share = f", {100 * achieved / args.copy_gbs:.1f}% of {args.copy_gbs:.0f} GB/s copy" if args.copy_gbs else ""
    print(f"one MoE layer at M=1: {per_layer_ms * 1e3:.1f} us for {gb * 1e3:.1f} MB of weights -> {achieved:.0f} GB/s{share}")


if __name__ == "__main__":
    main()
