"""Tensor parallelism on the CPU: ranks as threads of one process with the host-memory collective.
TP=2 logits equal TP=1 logits within the f32 tolerance and greedy continuations are equal, on the
peer's fixtures and on models with an uneven 128-unit split of the intermediate width."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import relative_l2, within
from glm_fixtures import checkpoint_dir, prompts
from test_glm_variants import BASE, write_model

import trellisforge
from trellisforge import TrellisError

TOL = 1e-4  # the ranks sum partial outputs in another order than one rank does: f32 rounding only


def compare(directory, token_lists, world=2, greedy_tokens=16):
    single = trellisforge.Engine(directory, max_seqs=4, kv_dtype="f32")
    sharded = trellisforge.Engine(directory, max_seqs=4, tp_world=world, kv_dtype="f32")
    for name, tokens in token_lists.items():
        a, b = single.logits(tokens), sharded.logits(tokens)
        within(max(relative_l2(b[t], a[t]) for t in range(len(tokens))), TOL, f"TP={world} vs TP=1, {name}")
        assert sharded.generate(tokens, greedy_tokens, stop_token_ids=[]) == single.generate(tokens, greedy_tokens, stop_token_ids=[]), name
    stats = sharded.stats()
    assert stats["pages_free"] == stats["pages_total"]


@pytest.mark.parametrize("variant", ["3.0", "4.0"])
def test_fixture_models_at_tp2(variant):
    compare(checkpoint_dir(variant), prompts())


@pytest.mark.parametrize("codebook", [None, "mul1"])
def test_uneven_split_of_the_intermediate_width(tmp_path, codebook):
    """384 = 3 units of 128: rank 0 takes 256 channels, rank 1 takes 128 (GLM-4.5-Air's 1408 = 11
    units splits 768 + 640 the same way)."""
    config = dict(BASE, head_dim=128, intermediate_size=384, moe_intermediate_size=384, n_shared_experts=1)
    model = write_model(tmp_path / "uneven", config, exl3_codebook=codebook, seed=9)
    tokens = {"random": [int(t) for t in np.random.default_rng(4).integers(0, BASE["vocab_size"], 30)]}
    compare(model, tokens)


def test_four_ranks(tmp_path):
    model = write_model(tmp_path / "four", dict(BASE, num_attention_heads=8, num_key_value_heads=4, intermediate_size=512,
                                                moe_intermediate_size=512), seed=2)
    compare(model, {"random": [int(t) for t in np.random.default_rng(5).integers(0, BASE["vocab_size"], 20)]}, world=4)


def test_batch_invariance_holds_at_tp2():
    p = prompts()
    engine = trellisforge.Engine(checkpoint_dir("3.0"), max_seqs=4, tp_world=2, kv_dtype="f32")
    alone = engine.logits(p["short"])
    batched = engine.logits_batch([p["long"], p["short"]])[1]
    assert np.array_equal(alone.view(np.uint32), batched.view(np.uint32))


def test_splits_that_cannot_be_made_are_refused(tmp_path):
    model = write_model(tmp_path / "odd", dict(BASE, num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(TrellisError, match="divide evenly"):
        trellisforge.Engine(model, tp_world=4, kv_dtype="f32")
    exl3 = write_model(tmp_path / "cut", dict(BASE), exl3_codebook="mul1")  # 64-dim heads: a KV head is half a block
    with pytest.raises(TrellisError, match="would cut a 128-channel EXL3 block"):
        trellisforge.Engine(exl3, tp_world=2, kv_dtype="f32")


WORKER = "import sys, trellisforge; trellisforge.run_tp_worker(sys.argv[1], int(sys.argv[2]), sys.argv[3])"


def start_worker(directory, rank: int, master: str, backend: str = "cpu"):
    """The worker takes the backend from the master; `backend` is for the reader."""
    import os
    import subprocess
    import sys
    from conftest import ROOT
    return subprocess.Popen([sys.executable, "-c", WORKER, str(directory), str(rank), master], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "python"), os.environ.get("PYTHONPATH")]))},
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_two_processes_on_loopback_equal_two_threads_bit_for_bit():
    from server_process import free_port
    directory = checkpoint_dir("3.0")
    master = f"127.0.0.1:{free_port()}"
    worker = start_worker(directory, 1, master)
    try:
        engine = trellisforge.Engine(directory, max_seqs=4, tp_world=2, tp_master=master, kv_dtype="f32")
        threads = trellisforge.Engine(directory, max_seqs=4, tp_world=2, kv_dtype="f32")
        single = trellisforge.Engine(directory, max_seqs=4, kv_dtype="f32")
        for name, tokens in prompts().items():
            over_tcp, in_process, reference = engine.logits(tokens), threads.logits(tokens), single.logits(tokens)
            assert np.array_equal(over_tcp.view(np.uint32), in_process.view(np.uint32)), name
            within(max(relative_l2(over_tcp[t], reference[t]) for t in range(len(tokens))), TOL, f"TCP TP=2 vs TP=1, {name}")
            assert engine.generate(tokens, 12, stop_token_ids=[]) == single.generate(tokens, 12, stop_token_ids=[])
        engine.close()  # tells the worker to stop
        assert worker.wait(timeout=30) == 0, worker.stdout.read()
    finally:
        if worker.poll() is None:
            worker.kill()


def test_a_dead_worker_fails_the_step_with_a_message():
    from server_process import free_port
    directory = checkpoint_dir("3.0")
    master = f"127.0.0.1:{free_port()}"
    worker = start_worker(directory, 1, master)
    engine = trellisforge.Engine(directory, max_seqs=4, tp_world=2, tp_master=master, kv_dtype="f32")
    tokens = prompts()["short"]
    assert len(engine.logits(tokens)) == len(tokens)
    worker.kill()
    worker.wait()
    with pytest.raises(TrellisError, match="tensor-parallel peer") as caught:
        engine.logits(tokens)
    assert caught.value.status_name == "io"
    with pytest.raises(TrellisError, match="tensor-parallel peer"):  # and stays failed, not hung
        engine.generate(tokens, 2)


def test_the_engine_benchmark_runs_at_tp2(capsys):
    from trellisforge import bench_engine
    bench_engine.main([str(checkpoint_dir("3.0")), "--tp", "2", "--prompt-tokens", "12", "--decode-tokens", "3"])
    out = capsys.readouterr().out
    assert "tp 2" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["prefill"], ["decode"])]
    assert [(r[0], int(r[1]), int(r[2])) for r in rows] == [("prefill", 1, 12), ("decode", 1, 2), ("decode", 4, 8), ("decode", 1, 2)]
