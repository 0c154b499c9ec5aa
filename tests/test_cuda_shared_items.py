"""Rows of one step that picked the same expert share its decoded tiles (tf_exl3_shared_item_linear:
the item path's grid, runs of up to 4 items of one table entry in one block). The bits must be the
item path's, whatever the step's rows: a prompt in chunks of 2, 3, 4 and 6 rows (the fixtures' 8
experts, top 4, and the merged shared expert: every chunk has entries named by several rows, runs
of 2 to 4 and a run cut at 4) equals the same chunks item by item (TF_CUDA_SHARED_ITEMS=0) and the
prompt computed one row per forward. The same switch puts a plain layer's 2 to 4 rows in one block
(q, k and v in tf_exl3_parts_linear4, the other plain linears in tf_exl3_group_linear4), which the
same chunks cover. A decode step of 3 streams takes the shared kernel for each MoE layer's gate/up
and down, and the 4-row kernels for every attention layer's projections; with the switch off it
takes none of them, and the streams' tokens and log-probabilities are the same bits. Skips, with
the library's reason, where no GPU is usable."""
from __future__ import annotations

import numpy as np
import pytest
from glm_fixtures import checkpoint_dir, model_config, prompts

import trellisforge
from trellisforge import Sampling

AVAILABLE, REASON = trellisforge.cuda_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")
SHARED = "tf_exl3_shared_item_linear"
PARTS4, GROUP4 = "tf_exl3_parts_linear4", "tf_exl3_group_linear4"


def engine(variant: str, rows_max: int, max_seqs: int = 2):
    return trellisforge.Engine(checkpoint_dir(variant), backend="cuda", max_seqs=max_seqs, rows_max=rows_max, kv_dtype="f32")


@pytest.mark.parametrize("variant", ["3.0", "4.0"])
def test_chunks_of_several_rows_give_the_bits_of_one_row_per_forward(variant, monkeypatch):
    # The experts of a prompt's rows on the GEMV too (the prompt kernels off), so that every chunk
    # is a step of several rows on the item path (fewer than 4 items per table entry).
    monkeypatch.setenv("TF_CUDA_PROMPT", "0")
    tokens = [int(t) for t in np.random.default_rng(19).integers(0, 2048, 37)]
    alone = engine(variant, 1).logits(tokens).view(np.uint32)
    for rows in (2, 3, 4, 6):
        shared = engine(variant, rows).logits(tokens).view(np.uint32)
        assert np.array_equal(shared, alone), (variant, rows)
    monkeypatch.setenv("TF_CUDA_SHARED_ITEMS", "0")
    for rows in (3, 6):
        assert np.array_equal(engine(variant, rows).logits(tokens).view(np.uint32), alone), (variant, rows, "switch off")


def three_streams(engine_, timed: bool):
    """Three sampled streams stepped together to the end; with `timed`, the first decode step of
    all three is timed. Returns each stream's (token, logprob) list and the timeline."""
    p = prompts()
    ids = [engine_.add(p[name], Sampling(max_tokens=10, temperature=0.8, seed=3 + i), stop_token_ids=[])
           for i, name in enumerate(("chat", "short", "random"))]
    tokens = {i: [] for i in ids}
    timeline, decoding = None, 0
    while engine_.stats()["sequences_live"] or engine_.stats()["sequences_waiting"]:
        arm = timed and timeline is None and decoding == 3
        if arm:
            engine_.time_next_step()
        events = engine_.step()
        for e in events:
            tokens[e.sequence_id].append((e.token, e.logprob))
        if arm:
            timeline = engine_.timeline()
        decoding = len(events)
    return [tokens[i] for i in ids], timeline


def test_a_decode_step_of_three_streams_takes_the_shared_kernel_with_the_same_bits(monkeypatch):
    config = model_config("3.0")
    moe_layers = config["num_hidden_layers"] - config["first_k_dense_replace"]
    shared, timeline = three_streams(engine("3.0", 64, max_seqs=3), timed=True)
    assert timeline is not None and all(len(s) == 10 for s in shared)
    names = [e["name"] for e in timeline]
    # Each MoE layer's routed gate/up and down (the shared expert runs beside them, on its own).
    assert names.count(SHARED) == 2 * moe_layers, names
    assert {e["part"] for e in timeline if e["name"] == SHARED} == {"ffn"}
    # Every attention layer's q, k and v in one 4-row launch, then o_proj on the 4-row group kernel.
    for layer in range(config["num_hidden_layers"]):
        attention = [e["name"] for e in timeline if e["layer"] == layer and e["part"] == "attention"]
        assert attention.count(PARTS4) == 1 and attention.count(GROUP4) == 1, (layer, attention)

    monkeypatch.setenv("TF_CUDA_SHARED_ITEMS", "0")
    apart, timeline = three_streams(engine("3.0", 64, max_seqs=3), timed=True)
    assert not {SHARED, PARTS4, GROUP4} & {e["name"] for e in timeline}
    assert apart == shared
    monkeypatch.setenv("TF_CUDA_GRAPHS", "0")
    monkeypatch.delenv("TF_CUDA_SHARED_ITEMS")
    direct, _ = three_streams(engine("3.0", 64, max_seqs=3), timed=False)
    assert direct == shared


def test_one_stream_keeps_the_item_kernel():
    """A row names an expert once: a step of one row has nothing to share, and keeps the item path
    (and q, k and v the one-row parts kernel)."""
    eng = engine("3.0", 64)
    eng.add(prompts()["short"], Sampling(max_tokens=4), stop_token_ids=[])
    eng.step()
    eng.time_next_step()
    eng.step()
    names = [e["name"] for e in eng.timeline()]
    assert not {SHARED, PARTS4, GROUP4} & set(names) and "tf_exl3_item_linear" in names
