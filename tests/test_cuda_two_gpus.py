"""Tensor parallelism 2 on two GPUs (issue 8): one process per GPU, the all-reduce inside the
forward through NCCL. Logits equal the one-GPU engine's within the f32 tolerance and greedy
continuations are equal, for the 3-bit and 4-bit fixtures; the server at TP=2 on the GPUs streams a
chat and reports a dead worker. Skips, with the reason, on machines with fewer than two GPUs."""
from __future__ import annotations

import pytest
from conftest import relative_l2, within
from glm_fixtures import checkpoint_dir, prompts
from server_process import free_port
from test_server_tp import run_tp2_server_and_kill_the_worker
from test_tensor_parallel import start_worker

import trellisforge

GPUS = trellisforge.cuda_device_count()
pytestmark = pytest.mark.skipif(GPUS < 2, reason=f"needs two GPUs, this machine has {GPUS}")
# Both sides are f32 GPU forwards; the TP=2 sums are split across ranks and added by NCCL.
TOL_TP = 1e-4


@pytest.mark.parametrize("variant", ["3.0", "4.0"])
def test_tp2_on_two_gpus_matches_one_gpu(monkeypatch, variant):
    monkeypatch.delenv("TRELLISFORGE_GPU", raising=False)  # rank r on GPU r
    monkeypatch.delenv("TRELLISFORGE_TP_COLLECTIVE", raising=False)  # NCCL
    directory = checkpoint_dir(variant)
    master = f"127.0.0.1:{free_port()}"
    worker = start_worker(directory, 1, master, backend="cuda")
    try:
        engine = trellisforge.Engine(directory, backend="cuda", max_seqs=4, tp_world=2, tp_master=master, kv_dtype="f32")
        one_gpu = trellisforge.Engine(directory, backend="cuda", max_seqs=4, kv_dtype="f32")
        for name, tokens in prompts().items():
            ours, expected = engine.logits(tokens), one_gpu.logits(tokens)
            within(max(relative_l2(ours[t], expected[t]) for t in range(len(tokens))), TOL_TP, f"{variant} {name}: TP=2 on 2 GPUs vs 1 GPU")
            assert engine.generate(tokens, 16, stop_token_ids=[]) == one_gpu.generate(tokens, 16, stop_token_ids=[]), name
        engine.close()
        assert worker.wait(timeout=60) == 0, worker.stdout.read()
    finally:
        if worker.poll() is None:
            worker.kill()


def test_tp2_server_on_two_gpus_and_a_dead_worker(monkeypatch):
    monkeypatch.delenv("TRELLISFORGE_GPU", raising=False)
    monkeypatch.delenv("TRELLISFORGE_TP_COLLECTIVE", raising=False)
    run_tp2_server_and_kill_the_worker("cuda")
