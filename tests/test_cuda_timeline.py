"""The step timeline (`bench_engine --profile`, Engine.time_next_step/timeline) on the GPU: a timed
step produces the same bits as an untimed one, its launches are the forward's (every layer, in
parts, embedding first and the logits summary last), and the bytes it states for the EXL3 linears
of a decode row are the checkpoint's trellis and sign vectors, counted from the file. On the CPU
backend the call is refused with the reason."""
from __future__ import annotations

import json

import numpy as np
import pytest
from glm_fixtures import checkpoint_dir

import trellisforge
from trellisforge import Sampling

AVAILABLE, REASON = trellisforge.cuda_available()
PROMPT = [5, 17, 300, 42, 7, 901, 33, 12]


def run(engine, timed_step=None):
    """Greedy tokens and log-probabilities of one sequence, stepping until it ends; with
    `timed_step`, that step (0 = the prompt's) is timed. Returns the events and the timeline."""
    engine.add(PROMPT, Sampling(max_tokens=6, top_logprobs=3), stop_token_ids=[])
    events, timeline, step, done = [], [], 0, False
    while not done:
        if step == timed_step:
            engine.time_next_step()
        for e in engine.step():
            events.append((e.token, e.logprob, e.top))
            done = done or e.finish_reason is not None
        if step == timed_step:
            timeline = engine.timeline()
        step += 1
    return events, timeline


def linear_bytes(directory, prefix: str) -> int:
    """What a decode row's GEMV reads of one EXL3 linear: its trellis and its two sign vectors."""
    with trellisforge.Checkpoint(directory) as checkpoint:
        sizes = {name: int(np.prod(shape)) * 2 for name, _, shape in checkpoint.tensors()}
    return sum(sizes[f"{prefix}.{part}"] for part in ("trellis", "suh", "svh"))


@pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")
def test_a_timed_step_keeps_the_bits_and_names_every_launch():
    directory = checkpoint_dir("3.0")
    config = json.loads((directory / "config.json").read_text())
    with trellisforge.Engine(directory, backend="cuda", max_seqs=2, kv_dtype="f16") as plain:
        want, _ = run(plain)
    with trellisforge.Engine(directory, backend="cuda", max_seqs=2, kv_dtype="f16") as timed:
        got, timeline = run(timed, timed_step=2)  # a decode step, which a replay would run
    assert len(want) == 6 and got == want, "a timed step changed what the step computes"

    assert timeline[0]["name"] == "tf_embed" and timeline[0]["part"] == "embed" and timeline[0]["layer"] == -1
    assert timeline[-1]["name"].startswith("tf_logits_summary") and timeline[-1]["part"] == "head"
    layers = config["num_hidden_layers"]
    assert {e["layer"] for e in timeline} == set(range(-1, layers))
    assert all(e["micros"] >= 0 for e in timeline) and sum(e["micros"] for e in timeline) > 0
    for layer in range(layers):
        parts = {e["part"] for e in timeline if e["layer"] == layer}
        assert parts == {"attention", "norm", "ffn"}, (layer, parts)
        names = [e["name"] for e in timeline if e["layer"] == layer and e["part"] == "attention"]
        assert "tf_qk_rope_store" in names and any(n.startswith("tf_attention") for n in names), names

    # A decode row reads each attention projection's whole weight once: q, k and v in one launch, o.
    for layer in range(layers):
        gemvs = ("tf_exl3_parts_linear", "tf_exl3_item_linear")
        assert [e["name"] for e in timeline if e["layer"] == layer and e["name"] in gemvs][:2] == list(gemvs), layer
        stated = sum(e["reads"] for e in timeline if e["layer"] == layer and e["part"] == "attention" and e["name"] in gemvs)
        expected = sum(linear_bytes(directory, f"model.layers.{layer}.self_attn.{p}") for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
        assert stated == expected, (layer, stated, expected)
    # The dense first layer's MLP likewise (gate/up as one pair launch, then down).
    stated = sum(e["reads"] for e in timeline if e["layer"] == 0 and e["part"] == "ffn")
    assert stated == sum(linear_bytes(directory, f"model.layers.0.mlp.{p}") for p in ("gate_proj", "up_proj", "down_proj"))
    # The cache: one row attending to its positions 0..pos, k and v of every kv head.
    attention = [e for e in timeline if e["layer"] == 0 and e["name"].startswith("tf_attention")]
    position = len(PROMPT) + 1  # step 2 decodes the second generated token
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_position = 2 * config["num_key_value_heads"] * head_dim * 2  # k and v, f16
    assert sum(e["reads"] for e in attention) == (position + 1) * per_position


def test_the_cpu_backend_refuses_a_timeline_with_the_reason():
    with trellisforge.Engine(checkpoint_dir("3.0"), backend="cpu", max_seqs=1) as engine:
        with pytest.raises(trellisforge.TrellisError, match="needs the cuda backend in this process"):
            engine.time_next_step()
        with pytest.raises(trellisforge.TrellisError, match="needs the cuda backend in this process"):
            engine.timeline()


def test_the_timeline_calls_refuse_bad_arguments():
    """The C ABI's timeline calls on a null engine, with a null count, or with entries missing for
    a capacity: a status and a message, never a crash."""
    from trellisforge._ffi import ffi, lib

    count = ffi.new("size_t *")
    for status in (lib.tf_engine_time_next_step(ffi.NULL), lib.tf_engine_timeline(ffi.NULL, ffi.NULL, 0, count)):
        assert status != 0 and "not a live engine" in ffi.string(lib.tf_last_error()).decode()
    with trellisforge.Engine(checkpoint_dir("3.0"), backend="cpu", max_seqs=1) as engine:
        handle = engine._live()
        assert lib.tf_engine_timeline(handle, ffi.NULL, 0, ffi.NULL) != 0
        assert "count_out is null" in ffi.string(lib.tf_last_error()).decode()
        assert lib.tf_engine_timeline(handle, ffi.NULL, 4, count) != 0
        assert "entries is null" in ffi.string(lib.tf_last_error()).decode()


def test_the_timeline_table_adds_up_per_part_and_kernel():
    """step_timeline.render's sums: per part and per kernel the launches, microseconds and bytes of
    the entries it was given, shares of the timeline's total, GB/s and % of copy from bytes/time;
    each distinct layer once, launch by launch."""
    from trellisforge import step_timeline

    def entry(name, layer, part, micros, reads=0):
        return {"name": name, "layer": layer, "part": part, "micros": micros, "reads": reads}

    entries = [entry("tf_embed", -1, "embed", 10.0)]
    for layer in range(3):
        entries += [entry("tf_exl3_item_linear", layer, "attention", 20.0, 40_000_000), entry("tf_rmsnorm", layer, "norm", 5.0),
                    entry("tf_exl3_item_linear", layer, "ffn", 25.0, 100_000_000)]
    entries.append(entry("tf_logits_summary", -1, "head", 5.0))
    text = step_timeline.render(entries, step_seconds=200e-6, bandwidth_gbs=4000.0, title="t")
    lines = text.splitlines()
    assert lines[0].startswith("step timeline: t: 11 launches, 165.0 us on the timeline, 200.0 us per step measured") and "(82%)" in lines[0]
    parts = {line.split()[0]: line.split() for line in lines[2:7]}
    assert parts["ffn"][1:6] == ["3", "75.0", "45.5%", "300.00", "4000"] and parts["ffn"][6] == "100.0%"
    assert parts["attention"][1:6] == ["3", "60.0", "36.4%", "120.00", "2000"] and parts["attention"][6] == "50.0%"
    assert parts["norm"][1:4] == ["3", "15.0", "9.1%"] and len(parts["norm"]) == 5  # no bytes: no rate
    kernel = next(line for line in lines if line.startswith("tf_exl3_item_linear") and " ffn " in line).split()
    assert kernel[2:5] == ["3", "25.00", "75.0"]
    # Layers 1 and 2 repeat layer 0's kernels: only layer 0 and the launches outside the layers are listed.
    assert [line for line in lines if line.startswith(("layer", "outside"))] == [
        "outside the layers, launch by launch (15.0 us):", "layer 0, launch by launch (50.0 us):"]
