"""The CUDA forward at tensor parallelism 2: two processes, each with its shard on the GPU, the plan
and (here) the all-reduce over TCP staged through host memory, so it runs on one GPU; on two GPUs
the same code reduces with NCCL (issue 8). Logits equal the CPU engine's at TP=1 within the f32
tolerance and greedy continuations are equal."""
from __future__ import annotations

import os

import pytest
from conftest import relative_l2, within
from glm_fixtures import checkpoint_dir, prompts
from server_process import free_port
from test_tensor_parallel import start_worker

import trellisforge

AVAILABLE, REASON = trellisforge.cuda_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")


def test_gpu_tp2_on_one_gpu_matches_cpu(monkeypatch):
    monkeypatch.setenv("TRELLISFORGE_TP_COLLECTIVE", "tcp")  # two ranks share the one GPU: no NCCL
    monkeypatch.setenv("TRELLISFORGE_GPU", "0")
    directory = checkpoint_dir("3.0")
    master = f"127.0.0.1:{free_port()}"
    worker = start_worker(directory, 1, master, backend="cuda")
    try:
        engine = trellisforge.Engine(directory, backend="cuda", max_seqs=4, tp_world=2, tp_master=master, kv_dtype="f32")
        reference = trellisforge.Engine(directory, max_seqs=4, kv_dtype="f32")
        for name, tokens in prompts().items():
            ours, expected = engine.logits(tokens), reference.logits(tokens)
            within(max(relative_l2(ours[t], expected[t]) for t in range(len(tokens))), 1e-4, f"GPU TP=2 vs CPU TP=1, {name}")
            assert engine.generate(tokens, 16, stop_token_ids=[]) == reference.generate(tokens, 16, stop_token_ids=[]), name
        engine.close()
        assert worker.wait(timeout=60) == 0, worker.stdout.read()
    finally:
        if worker.poll() is None:
            worker.kill()
