"""The CUDA forward at tensor parallelism 2: two processes, each with its shard on the GPU, the plan
and (here) the all-reduce over TCP staged through host memory, so it runs on one GPU; on two GPUs
the same code reduces with NCCL (issue 8). Logits equal the CPU engine's at TP=1 within the f32
tolerance and greedy continuations are equal: for class A's fixture, and for the latent-attention
classes and GLM-5.3-Flash (KDA heads, MLA heads and experts split; hyper-connections and the
indexer whole on each rank) on random checkpoints at the GPU kernels' shapes and on their fixtures
where ../shared is there."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import relative_l2, within
from glm_fixtures import checkpoint_dir, prompts
from mla_models import write_gpu_shaped
from server_process import free_port
from test_cuda_glm5_next import gpu_variant
from test_glm5_next_engine import fixture_or_skip
from test_mla_engine import family_or_skip
from test_tensor_parallel import start_worker

import trellisforge

AVAILABLE, REASON = trellisforge.cuda_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")
TOL = 1e-4  # f32 on both sides; the ranks' partial sums add in another order than one rank's


def check_tp2_on_one_gpu(monkeypatch, directory, token_lists: dict, greedy_tokens: int = 16):
    """GPU TP=2 (two processes on GPU 0, the sums over TCP) against the CPU and the GPU at TP=1."""
    monkeypatch.setenv("TRELLISFORGE_TP_COLLECTIVE", "tcp")  # two ranks share the one GPU: no NCCL
    monkeypatch.setenv("TRELLISFORGE_GPU", "0")
    master = f"127.0.0.1:{free_port()}"
    worker = start_worker(directory, 1, master, backend="cuda")
    try:
        engine = trellisforge.Engine(directory, backend="cuda", max_seqs=4, tp_world=2, tp_master=master, kv_dtype="f32")
        reference = trellisforge.Engine(directory, max_seqs=4, kv_dtype="f32")
        one_gpu = trellisforge.Engine(directory, backend="cuda", max_seqs=4, kv_dtype="f32")
        for name, tokens in token_lists.items():
            ours = engine.logits(tokens)
            for other, label in ((reference, "CPU TP=1"), (one_gpu, "GPU TP=1")):
                expected = other.logits(tokens)
                within(max(relative_l2(ours[t], expected[t]) for t in range(len(tokens))), TOL, f"GPU TP=2 vs {label}, {name}")
            assert engine.generate(tokens, greedy_tokens, stop_token_ids=[]) == reference.generate(tokens, greedy_tokens, stop_token_ids=[]), name
            # Rank 0 samples on its GPU as one GPU does: the same draws give the same tokens.
            sampled = dict(temperature=0.8, top_p=0.9, seed=21, stop_token_ids=[])
            before = engine.stats()["gpu_sampled"]
            assert engine.generate(tokens, 8, **sampled) == one_gpu.generate(tokens, 8, **sampled), name
            assert engine.stats()["gpu_sampled"] == before + 8, "rank 0 did not sample on its GPU"
        stats = engine.stats()
        assert stats["pages_free"] == stats["pages_total"] and stats["sequences_live"] == 0
        engine.close()
        assert worker.wait(timeout=60) == 0, worker.stdout.read()
    finally:
        if worker.poll() is None:
            worker.kill()


def random_prompts(vocab: int, lengths=(23, 70)) -> dict:
    rng = np.random.default_rng(11)
    return {f"random_{n}": [int(t) for t in rng.integers(0, vocab, n)] for n in lengths}


def test_gpu_tp2_on_one_gpu_matches_cpu(monkeypatch):
    check_tp2_on_one_gpu(monkeypatch, checkpoint_dir("3.0"), prompts())


@pytest.mark.parametrize("model_type", ["glm4_moe_lite", "glm_moe_dsa"])
def test_latent_attention_classes_at_gpu_tp2(tmp_path, monkeypatch, model_type):
    """MLA's heads split (q_b, kv_b, o_proj), the latent and the indexer whole on each rank; the
    70-token prompt is over index_topk 8, so the DSA model attends sparsely."""
    directory = write_gpu_shaped(tmp_path / model_type, model_type, seed=4)
    check_tp2_on_one_gpu(monkeypatch, directory, random_prompts(300))


def test_glm5_next_at_gpu_tp2(tmp_path, monkeypatch):
    """KDA's heads split (q/k/v, their convolution channels, gates, each slot's state), the NoPE
    MLA's heads and the experts; the hyper-connection streams and the pooled indexer whole on each
    rank, every sublayer's output summed before it is mixed into the streams."""
    directory = gpu_variant(tmp_path / "glm5_next", "base", moe_intermediate_size=256)
    check_tp2_on_one_gpu(monkeypatch, directory, random_prompts(300))


@pytest.mark.parametrize("family", ["glm4_moe_lite", "glm_moe_dsa", "glm5_next"])
def test_fixtures_at_gpu_tp2(monkeypatch, family):
    root = fixture_or_skip() if family == "glm5_next" else family_or_skip(family)
    token_lists = json.loads((root / "prompts.json").read_text())
    check_tp2_on_one_gpu(monkeypatch, root / "exl3_3.0bpw", {k: token_lists[k] for k in ("chat", "long")})


def test_rank_0_times_its_step_with_the_all_reduces(monkeypatch):
    """The step timeline on rank 0 of a GPU group: every layer's two sums are entries of their own
    (here the TCP collective staged through host memory; NCCL's are "nccl_all_reduce")."""
    directory = checkpoint_dir("3.0")
    monkeypatch.setenv("TRELLISFORGE_TP_COLLECTIVE", "tcp")
    monkeypatch.setenv("TRELLISFORGE_GPU", "0")
    master = f"127.0.0.1:{free_port()}"
    worker = start_worker(directory, 1, master, backend="cuda")
    try:
        layers = json.loads((directory / "config.json").read_text())["num_hidden_layers"]
        with trellisforge.Engine(directory, backend="cuda", max_seqs=2, tp_world=2, tp_master=master, kv_dtype="f16") as engine:
            engine.add(prompts()["chat"], trellisforge.Sampling(max_tokens=3), stop_token_ids=[])
            engine.step()
            engine.time_next_step()
            engine.step()
            timeline = engine.timeline()
        sums = [e for e in timeline if e["name"] == "host_all_reduce"]
        assert sorted(e["layer"] for e in sums) == sorted(list(range(layers)) * 2)
        assert timeline[-1]["name"].startswith("tf_logits_summary") and all(e["micros"] >= 0 for e in timeline)
        assert worker.wait(timeout=60) == 0, worker.stdout.read()
    finally:
        if worker.poll() is None:
            worker.kill()
