"""The in-memory synthetic model (tf_engine_create_synthetic): a config alone gives a servable
engine over random EXL3 weights, for full-size benchmarks with no checkpoint on disk. Its
forward is the one the fixture tests prove; here: the seed fixes the weights bit for bit, the
weights keep activations O(1) so timings see real numbers, and bad configs are clear errors.
On a GPU, the CUDA forward of a synthetic model matches the CPU forward."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import relative_l2, within

import trellisforge
from trellisforge.synthesize import shape_config

PROMPT = [3, 17, 42, 99, 7, 250, 1, 64]


@pytest.fixture(scope="module")
def tiny():
    with trellisforge.Engine.synthetic("tiny", bits=3, seed=5, max_seqs=4, kv_dtype="f32") as engine:
        yield engine


def test_same_seed_same_bits_other_seed_other_weights(tiny):
    logits = tiny.logits(PROMPT)
    assert logits.shape == (len(PROMPT), shape_config("tiny")["vocab_size"])
    assert np.isfinite(logits).all()
    with trellisforge.Engine.synthetic("tiny", bits=3, seed=5, max_seqs=4, kv_dtype="f32") as again:
        assert np.array_equal(again.logits(PROMPT).view(np.uint32), logits.view(np.uint32))
    with trellisforge.Engine.synthetic("tiny", bits=3, seed=6, max_seqs=4, kv_dtype="f32") as other:
        assert relative_l2(other.logits(PROMPT)[-1], logits[-1]) > 0.1
    with trellisforge.Engine.synthetic("tiny", bits=2, seed=5, max_seqs=4, kv_dtype="f32") as fewer_bits:
        assert relative_l2(fewer_bits.logits(PROMPT)[-1], logits[-1]) > 0.01


def test_activations_stay_order_one(tiny):
    spread = float(np.std(tiny.logits(PROMPT)[-1]))
    assert 0.05 < spread < 50, f"logit spread {spread} would make a benchmark time NaNs or zeros"


def test_it_generates_and_frees_its_pages(tiny):
    out = tiny.generate(PROMPT, max_tokens=6)
    assert len(out) == 6 and all(0 <= t < tiny.vocab_size for t in out)
    stats = tiny.stats()
    assert stats["pages_free"] == stats["pages_total"]


def test_config_dict_and_shape_name_agree():
    with trellisforge.Engine.synthetic(shape_config("tiny-2l"), seed=1, kv_dtype="f32") as by_dict, \
            trellisforge.Engine.synthetic("tiny-2l", seed=1, kv_dtype="f32") as by_name:
        assert np.array_equal(by_dict.logits(PROMPT[:3]), by_name.logits(PROMPT[:3]))


@pytest.mark.parametrize("config, bits, message", [
    ({**shape_config("tiny"), "hidden_size": 0}, 3, "hidden_size"),
    ({k: v for k, v in shape_config("tiny").items() if k != "num_attention_heads"}, 3, "num_attention_heads"),
    (shape_config("tiny"), 0, "bits"),
    (shape_config("tiny"), 9, "bits"),
])
def test_bad_config_is_a_clear_error(config, bits, message):
    with pytest.raises(trellisforge.TrellisError, match=message):
        trellisforge.Engine.synthetic(config, bits=bits, kv_dtype="f32")


def test_malformed_json_is_a_clear_error():
    handle = trellisforge._ffi.ffi.new("tf_engine **")
    text = b'{"hidden_size": 256,'
    status = trellisforge._ffi.lib.tf_engine_create_synthetic(text, len(text), trellisforge._ffi.ffi.NULL, 3, 0, handle)
    assert status != 0 and handle[0] == trellisforge._ffi.ffi.NULL
    assert trellisforge._ffi.ffi.string(trellisforge._ffi.lib.tf_last_error())


AVAILABLE, REASON = trellisforge.cuda_available()


@pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")
def test_gpu_forward_of_a_synthetic_model_matches_cpu(tiny):
    with trellisforge.Engine.synthetic("tiny", bits=3, seed=5, backend="cuda", max_seqs=4, kv_dtype="f32") as gpu:
        on_gpu, on_cpu = gpu.logits(PROMPT), tiny.logits(PROMPT)
        within(max(relative_l2(on_gpu[t], on_cpu[t]) for t in range(len(PROMPT))), 1e-4, "synthetic GPU vs CPU")


def test_the_engine_benchmark_runs_on_a_synthetic_model(capsys):
    from trellisforge import bench_engine, roofline
    bench_engine.main(["--synthetic", "tiny-2l", "--prompt-tokens", "12", "--decode-tokens", "3", "--decode-context", "40",
                       "--bandwidth-gbs", "100"])
    table = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in table if line.split()[:1] in (["prefill"], ["decode"])]
    assert [(r[0], int(r[1]), int(r[2])) for r in rows] == [("prefill", 1, 12), ("decode", 1, 2), ("decode", 4, 8), ("decode", 1, 2)]
    assert rows[0][5:] == ["rows_max", "256"]
    assert all(float(r[4]) > 0 for r in rows)
    # Each decode row: the bytes its steps read at the mean context, the tokens/s 100 GB/s allow
    # for them, and the measured share of that.
    config = shape_config("tiny-2l")
    modules = roofline.synthetic_modules(config, 3, 6)
    for row, streams, sampling in zip(rows[1:], (1, 4, 1), ("greedy,", "greedy,", "t0.7p0.95,")):
        assert row[8:] == [sampling, "context", "40"]
        step = roofline.step_bytes(modules, config, streams, 40 + 3 // 2, "f16")  # bench_engine's default cache
        assert float(row[5]) == pytest.approx(step / 1e6, abs=0.05)
        assert float(row[6]) == pytest.approx(streams * 100e9 / step, rel=1e-3)
        assert float(row[7].rstrip("%")) == pytest.approx(100 * float(row[4]) / float(row[6]), abs=0.1)


def test_the_engine_benchmark_says_when_its_streams_end_early(capsys):
    """Streams that reach the context limit before the row's timed steps end: the row is still
    printed, the ended streams are not cancelled (cancel would refuse them), and stderr says why."""
    from trellisforge import bench_engine
    bench_engine.main(["--synthetic", "tiny-2l", "--prompt-tokens", "12", "--decode-tokens", "12", "--decode-context", "40",
                       "--ctx", "48", "--max-seqs", "4", "--sampled-streams", "0"])
    captured = capsys.readouterr()
    rows = [line.split() for line in captured.out.splitlines() if line.split()[:1] == ["decode"]]
    assert [(r[0], int(r[1])) for r in rows] == [("decode", 1), ("decode", 4)]
    assert "decode row of 4 stream(s): 4 ended before its last timed step (context 48 tokens" in captured.err
    assert "raise --ctx or --max-seqs" in captured.err


def test_the_layer_benchmark_runs_on_synthetic_models(capsys):
    from trellisforge import bench_layers
    bench_layers.main(["--synthetic", "tiny-2l", "tiny-3l", "--backend", "cpu", "--steps", "2"])
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("tiny-")]
    assert [(r[0], int(r[1])) for r in rows] == [("tiny-2l", 1), ("tiny-3l", 2)]
    assert "one MoE layer at M=1:" in out


# The MLA shapes at a test's size: their structure (latent attention, GLM-5's indexer and dense
# layers first) with small widths.
SMALL_MLA = dict(hidden_size=256, q_lora_rank=64, num_attention_heads=4, num_key_value_heads=4, qk_nope_head_dim=32,
                 v_head_dim=32, intermediate_size=512, moe_intermediate_size=128, n_routed_experts=8,
                 num_experts_per_tok=2, vocab_size=1024, index_n_heads=4, index_topk=4)


@pytest.mark.parametrize("shape", ["glm-4.7-flash-2l", "glm-5-4l"])
def test_mla_shapes_run_in_memory(shape):
    config = {**shape_config(shape), **SMALL_MLA}
    assert config["num_hidden_layers"] == int(shape.split("-")[-1][:-1])
    assert config["first_k_dense_replace"] <= config["num_hidden_layers"]
    with trellisforge.Engine.synthetic(config, seed=3, max_seqs=2, kv_dtype="f32") as engine:
        logits = engine.logits(PROMPT)
        assert logits.shape == (len(PROMPT), SMALL_MLA["vocab_size"]) and np.isfinite(logits).all()
        spread = float(np.std(logits[-1]))
        assert 0.05 < spread < 50


def test_mla_shapes_are_not_written_as_files():
    from trellisforge.synthesize import plan_tensors
    with pytest.raises(ValueError, match="Engine.synthetic"):
        plan_tensors(shape_config("glm-5"), 3, 6, "3inst")


def test_the_engine_benchmark_times_a_shared_prefix(capsys):
    """--shared-prefix: the second prompt finds the first's full pages in the prefix cache, and the
    row says how many and how its time to first token compares."""
    from trellisforge import bench_engine
    bench_engine.main(["--synthetic", "tiny-2l", "--prompt-tokens", "12", "--decode-tokens", "3", "--shared-prefix", "100"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["prefix"]]
    assert len(rows) == 1
    assert rows[0][1:3] == ["1", "164"] and float(rows[0][4]) > 0
    # 100 shared tokens in 16-token pages: 6 full pages.
    assert " ".join(rows[0][5:]).startswith("shared 100, 96 cached:")


def test_the_benchmark_puts_ranks_beyond_the_gpus_on_gpu_0_over_tcp(monkeypatch):
    """bench_engine --tp N on fewer than N GPUs: NCCL refuses two ranks on one GPU, so the ranks
    share GPU 0 and sum over TCP; enough GPUs, or a collective the caller chose, are left alone."""
    import os
    from trellisforge import bench_engine
    environment: dict[str, str] = {}
    monkeypatch.setattr(os, "environ", environment)
    assert bench_engine.share_gpus(2, 2) is None and environment == {}
    note = bench_engine.share_gpus(2, 1)
    assert environment == {"TRELLISFORGE_GPU": "0", "TRELLISFORGE_TP_COLLECTIVE": "tcp"}
    assert note.startswith("2 ranks on 1 GPU(s): every rank on GPU 0")
    environment.clear()
    environment.update(TRELLISFORGE_TP_COLLECTIVE="nccl")
    assert bench_engine.share_gpus(4, 1) is None and environment == {"TRELLISFORGE_TP_COLLECTIVE": "nccl"}
