"""The roofline bench_engine prints (python/trellisforge/roofline.py): the bytes the synthesizer's
formula gives each module equal what the peer's converter stored for the same config, module by
module; a step counts every weight once, the embedding a row per row and the routed experts as
many as its rows are expected to pick; the KV reads follow each attention's cache."""
from __future__ import annotations

import json

import pytest
from glm_fixtures import checkpoint_dir
from test_mla_engine import family_or_skip

from trellisforge import roofline


def config_of(model_dir) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def test_the_formula_is_what_the_peer_stored():
    model = checkpoint_dir("3.0")
    assert roofline.synthetic_modules(config_of(model), 3, 6) == roofline.checkpoint_modules(model)


@pytest.mark.parametrize("family", ["glm4_moe_lite", "glm_moe_dsa"])
def test_the_formula_is_what_the_peer_stored_for_mla(family):
    model = family_or_skip(family) / "exl3_3.0bpw"
    assert roofline.synthetic_modules(config_of(model), 3, 6) == roofline.checkpoint_modules(model)


def test_a_step_reads_each_weight_once_and_the_picked_experts():
    model = checkpoint_dir("3.0")
    config, modules = config_of(model), roofline.checkpoint_modules(model)
    experts = {n: b for n, b in modules.items() if ".mlp.experts." in n}
    others = sum(b for n, b in modules.items() if n not in experts and n != "model.embed_tokens")
    row = modules["model.embed_tokens"] / config["vocab_size"]
    E, k = config["n_routed_experts"], config["num_experts_per_tok"]
    assert roofline.step_bytes(modules, config, 1, 0) == pytest.approx(others + row + sum(experts.values()) * k / E)
    # Two rows pick 2k - k²/E distinct experts on average (the second row's k miss the first's
    # with probability 1 - k/E each).
    assert roofline.expected_experts(E, k, 2) == pytest.approx(2 * k - k * k / E)
    many = roofline.step_bytes(modules, config, 10_000, 0)
    assert many == pytest.approx(others + 10_000 * row + sum(experts.values()), rel=1e-9)


def test_kv_reads_follow_the_attention():
    gqa = {"num_hidden_layers": 2, "hidden_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}
    assert roofline.kv_bytes(gqa, 100, [False, False]) == 2 * 100 * 2 * 2 * 64 * 4
    mla = {"num_hidden_layers": 2, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    assert roofline.kv_bytes(mla, 100, [False, False]) == 2 * 100 * 576 * 4
    dsa = {**mla, "index_topk": 64, "index_head_dim": 128}
    # Both layers attend to their 64 selected positions; only the first scores every key.
    assert roofline.kv_bytes(dsa, 100, [True, False]) == 2 * 64 * 576 * 4 + 100 * 128 * 4
