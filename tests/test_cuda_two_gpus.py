"""Tensor parallelism 2 on two GPUs (issue 8): one process per GPU, the all-reduce inside the
forward through NCCL, recorded in the replayed decode steps (TF_CUDA_TP_GRAPHS=0: queued). Logits
equal the one-GPU engine's within the f32 tolerance, greedy and GPU-sampled continuations are
equal, with the recording on and off, for the 3-bit and 4-bit fixtures, GLM-4.7-Flash- and
GLM-5-shaped random checkpoints and a GLM-5.3-Flash variant; the server at TP=2 on the GPUs streams
a chat and reports a dead worker. Skips, with the reason, on machines with fewer than two GPUs."""
from __future__ import annotations

import pytest
from conftest import relative_l2, within
from glm_fixtures import checkpoint_dir, prompts
from mla_models import write_gpu_shaped
from server_process import free_port
from test_cuda_glm5_next import gpu_variant
from test_cuda_tensor_parallel import random_prompts
from test_server_tp import run_tp2_server_and_kill_the_worker
from test_tensor_parallel import start_worker

import trellisforge

GPUS = trellisforge.cuda_device_count()
pytestmark = pytest.mark.skipif(GPUS < 2, reason=f"needs two GPUs, this machine has {GPUS}")
# Both sides are f32 GPU forwards; the TP=2 sums are split across ranks and added by NCCL.
TOL_TP = 1e-4


def check_two_gpus(monkeypatch, directory, token_lists: dict):
    """Rank r on GPU r, NCCL inside the forward, recorded in the replayed decode steps: logits and
    greedy and sampled continuations against one GPU, and the same tokens with the recording off."""
    monkeypatch.delenv("TRELLISFORGE_GPU", raising=False)  # rank r on GPU r
    monkeypatch.delenv("TRELLISFORGE_TP_COLLECTIVE", raising=False)  # NCCL
    runs = {}
    for graphs in ("1", "0"):
        monkeypatch.setenv("TF_CUDA_TP_GRAPHS", graphs)
        master = f"127.0.0.1:{free_port()}"
        worker = start_worker(directory, 1, master, backend="cuda")
        try:
            engine = trellisforge.Engine(directory, backend="cuda", max_seqs=4, tp_world=2, tp_master=master, kv_dtype="f32")
            one_gpu = trellisforge.Engine(directory, backend="cuda", max_seqs=4, kv_dtype="f32")
            sampled = dict(temperature=0.8, top_p=0.9, seed=21, stop_token_ids=[])
            runs[graphs] = []
            for name, tokens in token_lists.items():
                ours, expected = engine.logits(tokens), one_gpu.logits(tokens)
                within(max(relative_l2(ours[t], expected[t]) for t in range(len(tokens))), TOL_TP, f"{name}: TP=2 on 2 GPUs vs 1 GPU")
                greedy = engine.generate(tokens, 16, stop_token_ids=[])
                assert greedy == one_gpu.generate(tokens, 16, stop_token_ids=[]), name
                drawn = engine.generate(tokens, 8, **sampled)
                assert drawn == one_gpu.generate(tokens, 8, **sampled), name
                runs[graphs].append((greedy, drawn))
            stats = engine.stats()
            assert (stats["graph_replays"] > 0) == (graphs == "1"), stats
            assert stats["gpu_sampled"] == 8 * len(token_lists)
            engine.close()
            assert worker.wait(timeout=60) == 0, worker.stdout.read()
        finally:
            if worker.poll() is None:
                worker.kill()
    assert runs["1"] == runs["0"], "recorded and queued TP forwards chose other tokens"


@pytest.mark.parametrize("variant", ["3.0", "4.0"])
def test_tp2_on_two_gpus_matches_one_gpu(monkeypatch, variant):
    check_two_gpus(monkeypatch, checkpoint_dir(variant), prompts())


@pytest.mark.parametrize("model_type", ["glm4_moe_lite", "glm_moe_dsa"])
def test_latent_attention_classes_on_two_gpus(tmp_path, monkeypatch, model_type):
    check_two_gpus(monkeypatch, write_gpu_shaped(tmp_path / model_type, model_type, seed=4), random_prompts(300))


def test_glm5_next_on_two_gpus(tmp_path, monkeypatch):
    check_two_gpus(monkeypatch, gpu_variant(tmp_path / "glm5_next", "base", moe_intermediate_size=256), random_prompts(300))


def test_tp2_server_on_two_gpus_and_a_dead_worker(monkeypatch):
    monkeypatch.delenv("TRELLISFORGE_GPU", raising=False)
    monkeypatch.delenv("TRELLISFORGE_TP_COLLECTIVE", raising=False)
    run_tp2_server_and_kill_the_worker("cuda")
