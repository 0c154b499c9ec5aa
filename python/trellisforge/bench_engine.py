"""Engine throughput on a model directory, or on a synthetic model made in memory, as a table (a
benchmark, not a test):

    python -m trellisforge.bench_engine MODEL_DIR [--prompt-tokens 256] [--decode-tokens 64]
    python -m trellisforge.bench_engine --synthetic glm-4.5-air [--bits 3] --backend cuda
    python -m trellisforge.bench_engine MODEL_DIR --backend cuda --tp 2     (one GPU per rank)

Prefill: one prompt's logits at every position. Decode: greedy tokens per second for 1 and for 4
concurrent sequences (continuous batching), and sampled for 1. With --shared-prefix N (the engine
then runs its prefix cache): two prompts of the same N tokens and 64 of their own, one after the
other; the "prefix" row is the second one's time to first token, beside the first's. With --tp N the ranks 1..N-1 are
worker processes on loopback (rank r on GPU r with cuda).

Beside each decode row: the megabytes a step must read (roofline.py: weights as stored, the
routed experts the step's rows are expected to pick, the KV cache in --kv-dtype at the row's mean context)
and, given --bandwidth-gbs (tf-bench's measured copy bandwidth, per GPU), the tokens per second
that bandwidth allows and the measured share of it. With --profile, after each greedy row's timed
steps one more step is timed launch by launch (step_timeline.py), and so is the first chunk of the
prompt prefilled once more after the timed prefill."""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np

from . import Engine, Sampling, cuda_device_count, library_path, roofline, step_timeline


def share_gpus(ranks: int, gpus: int) -> str | None:
    """More ranks than GPUs: every rank on GPU 0, the sums over TCP, since NCCL refuses two ranks on
    one GPU (ncclInvalidUsage). Set in the environment the workers inherit; a collective the caller
    chose is kept. Returns the note printed, or None."""
    if gpus >= ranks or "TRELLISFORGE_TP_COLLECTIVE" in os.environ:
        return None
    os.environ.setdefault("TRELLISFORGE_GPU", "0")
    os.environ["TRELLISFORGE_TP_COLLECTIVE"] = "tcp"
    return f"{ranks} ranks on {gpus} GPU(s): every rank on GPU {os.environ['TRELLISFORGE_GPU']}, the sums over TCP (NCCL needs a GPU per rank)"


def stream_prompt(prompt: list[int], tokens: int, stream: int, vocab: int) -> list[int]:
    """Stream 0's decode context is the prompt's first `tokens`; each later stream's, random tokens
    of its own."""
    if stream == 0:
        return prompt[:tokens]
    return [int(t) for t in np.random.default_rng(1000 + stream).integers(10, vocab, tokens)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", nargs="?")
    parser.add_argument("--synthetic", metavar="SHAPE", help="random EXL3 weights of a synthesize shape, made in memory")
    parser.add_argument("--bits", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks as processes on loopback (MODEL_DIR only)")
    parser.add_argument("--decode-context", type=int, default=16, help="prompt tokens before each decode stream: the context its attention reads")
    parser.add_argument("--max-seqs", type=int, default=8, help="sequences the engine holds (its KV pages: max-seqs x ctx tokens)")
    parser.add_argument("--ctx", type=int, default=0, help="the engine's context limit (0: the model's, capped at what the KV pool holds: max-seqs x min(model's, 8192))")
    parser.add_argument("--rows-max", type=int, default=256, help="rows per forward: the prompt's chunk size")
    parser.add_argument("--bandwidth-gbs", type=float, default=0.0, help="memory bandwidth per GPU (tf-bench's copy GB/s) for the roofline")
    parser.add_argument("--shared-prefix", type=int, default=0,
                        help="with the prefix cache on: the time to first token of a prompt sharing N tokens with the one before")
    parser.add_argument("--streams", default="1,4", help="the greedy decode rows' stream counts, comma-separated")
    parser.add_argument("--sampled-streams", type=int, default=1, help="streams of the sampled decode row (0: no such row)")
    parser.add_argument("--kv-dtype", default="f16", choices=["f32", "f16", "fp8"], help="what the KV cache stores")
    parser.add_argument("--profile", action="store_true", help="a kernel timeline of one step of each greedy decode row and of a prompt chunk (cuda; at --tp, rank 0's, its all-reduces named)")
    args = parser.parse_args(argv)
    if (args.model_dir is None) == (args.synthetic is None):
        parser.error("give MODEL_DIR or --synthetic SHAPE")
    if args.tp > 1 and args.synthetic:
        parser.error("--tp needs MODEL_DIR: every rank loads its shard from the checkpoint")
    workers = []
    load_start = time.perf_counter()
    if args.synthetic:
        engine = Engine.synthetic(args.synthetic, bits=args.bits, backend=args.backend, max_seqs=args.max_seqs, rows_max=args.rows_max, ctx=args.ctx,
                                  prefix_cache=args.shared_prefix > 0, kv_dtype=args.kv_dtype)
    elif args.tp > 1:
        note = share_gpus(args.tp, cuda_device_count()) if args.backend == "cuda" else None
        if note:
            print(note)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            master = f"127.0.0.1:{probe.getsockname()[1]}"
        code = "import sys, trellisforge; trellisforge.run_tp_worker(sys.argv[1], int(sys.argv[2]), sys.argv[3])"
        workers = [subprocess.Popen([sys.executable, "-c", code, args.model_dir, str(rank), master]) for rank in range(1, args.tp)]
        engine = Engine(args.model_dir, backend=args.backend, max_seqs=args.max_seqs, tp_world=args.tp, tp_master=master, rows_max=args.rows_max, ctx=args.ctx,
                        prefix_cache=args.shared_prefix > 0, kv_dtype=args.kv_dtype)
    else:
        engine = Engine(args.model_dir, backend=args.backend, max_seqs=args.max_seqs, rows_max=args.rows_max, ctx=args.ctx,
                        prefix_cache=args.shared_prefix > 0, kv_dtype=args.kv_dtype)
    load_seconds = time.perf_counter() - load_start
    if args.synthetic:
        from .synthesize import shape_config
        config = shape_config(args.synthetic)
        modules = roofline.synthetic_modules(config, args.bits, 6)  # Engine.synthetic's head bits
    else:
        config = json.loads((pathlib.Path(args.model_dir) / "config.json").read_text())
        modules = roofline.checkpoint_modules(args.model_dir)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(10, engine.vocab_size, max(args.prompt_tokens, args.decode_context))]
    engine.logits(prompt[:8])  # warm up (thread start, page faults)
    rows = []
    timelines = []
    # Prefill as a request sees it: the prompt in chunks of rows_max rows, logits for its last row
    # only, until the first token (time to first token).
    engine.add(prompt[:args.prompt_tokens], Sampling(max_tokens=1), stop_token_ids=[])
    start = time.perf_counter()
    while not engine.step():
        pass
    elapsed = time.perf_counter() - start
    while engine.stats()["sequences_live"]:
        engine.step()
    rows.append(("prefill", 1, args.prompt_tokens, elapsed, args.prompt_tokens / elapsed, f"rows_max {args.rows_max}"))
    roofs = [None]
    if args.profile:
        # A prompt chunk's launches: the first step of the same prompt again, against the timed
        # prefill's mean step.
        chunks = -(-args.prompt_tokens // args.rows_max)
        engine.add(prompt[:args.prompt_tokens], Sampling(max_tokens=1), stop_token_ids=[])
        engine.time_next_step()
        engine.step()
        timelines.append((f"prefill, a chunk of {min(args.rows_max, args.prompt_tokens)} prompt rows", engine.timeline(), elapsed / chunks))
        while engine.stats()["sequences_live"]:
            engine.step()
    if args.shared_prefix:
        rows.append(shared_prefix_row(engine, args.shared_prefix, rng))
        roofs.append(None)
    # Greedy, then sampled as chat clients do (temperature 0.7, top-p 0.95): on a GPU the sampled
    # row is drawn there (tf_sample_*), only its token crossing to the host.
    # Streams run until cancelled: long prompts prefill in turn, and a stream that ended after
    # decode_tokens would be gone before the last one started (at a 32k context, four of them
    # timed nothing).
    budget = max(engine.context_tokens_max - args.decode_context, args.decode_tokens)
    decode_rows = [(int(n), "greedy") for n in args.streams.split(",") if n]
    if args.sampled_streams:
        decode_rows.append((args.sampled_streams, "t0.7p0.95"))
    for streams, sampling in decode_rows:
        params = Sampling(max_tokens=budget)
        if sampling != "greedy":
            params = Sampling(max_tokens=budget, temperature=0.7, top_p=0.95, seed=1)
        # Each stream its own prompt: streams of one prompt decode the same tokens and pick the
        # same experts at every step, which flatters whatever shares work between rows.
        ids = [engine.add(stream_prompt(prompt, args.decode_context, i, engine.vocab_size), params, stop_token_ids=[]) for i in range(streams)]
        # A stream can end on its own (its context, or a KV pool too small for every stream's):
        # it is not cancelled, and the row says it timed fewer streams.
        ended: set[int] = set()

        def step() -> list:
            events = engine.step()
            ended.update(event.sequence_id for event in events if event.finish_reason is not None)
            return events

        # Timed: decode_tokens - 1 steps in which every stream decodes, from the last stream's
        # first token on.
        started = set()
        while len(started) < streams:
            started.update(event.sequence_id for event in step())
        produced = 0
        start = time.perf_counter()
        for _ in range(args.decode_tokens - 1):
            produced += len(step())
        elapsed = time.perf_counter() - start
        if args.profile and sampling == "greedy":
            engine.time_next_step()
            step()
            timelines.append((f"{streams} stream(s), context {args.decode_context}", engine.timeline(), elapsed / (args.decode_tokens - 1)))
        for sequence_id in ids:
            if sequence_id not in ended:
                engine.cancel(sequence_id)
        if ended:
            print(f"decode row of {streams} stream(s): {len(ended)} ended before its last timed step "
                  f"(context {engine.context_tokens_max} tokens, KV pool {engine.stats()['pages_total']} pages): "
                  "it timed fewer streams; raise --ctx or --max-seqs", file=sys.stderr)
        while engine.stats()["sequences_live"]:
            engine.step()
        rows.append(("decode", streams, produced, elapsed, produced / elapsed, f"{sampling}, context {args.decode_context}"))
        step = roofline.step_bytes(modules, config, streams, args.decode_context + args.decode_tokens // 2, args.kv_dtype)
        roofs.append((step, streams * args.bandwidth_gbs * 1e9 * max(args.tp, 1) / step if args.bandwidth_gbs else 0.0))
    engine.close()
    for worker in workers:
        worker.wait(timeout=60)
    print(f"model {args.model_dir or args.synthetic + f' (synthetic, {args.bits} bits)'}, library {library_path()}, backend {args.backend}, kv {args.kv_dtype}, tp {args.tp}, threads {os.environ.get('TF_THREADS', os.cpu_count())}")
    print(f"engine ready in {load_seconds:.1f} s")
    if not args.bandwidth_gbs:
        print("roofline: pass --bandwidth-gbs (tf-bench's copy bandwidth) for the tokens/s a step's reads allow")
    print(f"{'phase':<8} {'streams':>7} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'MB/step':>8} {'roofline':>9} {'% roof':>7}  sampling")
    for (phase, streams, tokens, seconds, rate, sampling), roof in zip(rows, roofs):
        step, limit = roof if roof else (0.0, 0.0)
        extra = f"{step / 1e6:>8.1f} " if roof else f"{'':>8} "
        extra += f"{limit:>9.1f} {100 * rate / limit:>6.1f}%" if limit else f"{'':>9} {'':>7}"
        print(f"{phase:<8} {streams:>7} {tokens:>7} {seconds:>8.3f} {rate:>9.1f} {extra}  {sampling}")
    for title, entries, step_seconds in timelines:
        print()
        print(step_timeline.render(entries, step_seconds, args.bandwidth_gbs, title))


def shared_prefix_row(engine, shared: int, rng) -> tuple:
    """Two prompts of the same `shared` tokens and 64 of their own, one after the other: the second
    one's time to first token and how it compares with the first's."""
    common = [int(t) for t in rng.integers(10, engine.vocab_size, shared)]
    times, cached = [], 0
    for _ in range(2):
        engine.add(common + [int(t) for t in rng.integers(10, engine.vocab_size, 64)], Sampling(max_tokens=1), stop_token_ids=[])
        start = time.perf_counter()
        events = []
        while not events:
            events = engine.step()
        times.append(time.perf_counter() - start)
        cached = events[0].cached_tokens
        while engine.stats()["sequences_live"]:
            engine.step()
    tokens = shared + 64
    note = f"shared {shared}, {cached} cached: {100 * times[1] / times[0]:.1f}% of the first's {times[0]:.3f} s"
    return ("prefix", 1, tokens, times[1], tokens / times[1], note)


if __name__ == "__main__":
    main()
