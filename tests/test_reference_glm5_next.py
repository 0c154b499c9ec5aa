"""The float64 numpy reference of glm5_next / GLM-5.3-Flash (python/trellisforge/reference/glm5_next.py
with kda.py, mhc.py, kpool.py) against the truth, transformers 5.17: its fp32 logits of the fixture
checkpoint (`dequant_ref`, ../shared/fixtures/glm5_next: all-position prefill logits of each prompt
and the logits of 32 greedy steps) and, where torch and transformers are installed (not in CI), its
forward of the random checkpoints of glm5_next_models.py."""
from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest
from conftest import SHARED, relative_l2, within
from glm5_next_models import VARIANTS, prompt, variant_config, write_model, write_variant

from trellisforge import safetensors_io
from trellisforge.reference import glm5_next, kpool

# float64 vs transformers' fp32 (the fixture): measured 2.4e-6 .. 2.9e-6 at the worst position of
# each prompt, prefill and greedy steps alike; transformers against its own fixture (the same fp32
# weights, prefill once more) is 3.9e-6 off: fp32 rounding, e.g. the chunked KDA's cumulated log
# decays. Measured mistakes, for scale: one Sinkhorn round more 3.1e-5, the q_a/kv_a layernorm eps
# 1e-6 (glm_moe_dsa's) 2.1e-5, the hyper-head as a sum of streams 5.1e-5, the mHC input norm with
# hc_eps 0.048, the KDA o_norm eps 1e-6 1.2, no compress_ape 0.026 (long, before its first tie),
# top-128 pools for top-32 0.07, no tail 1.3; not seen: the KDA l2norm eps 1e-12 (3.9e-6).
TOL = 6e-6
# The random checkpoints (hidden 64, 72 tokens) against transformers in fp32: measured 3.0e-6 ..
# 8.0e-6 (kpool_2); against transformers in float64 (its fp32 casts promoted): 3.5e-15 .. 1.3e-14,
# i.e. the reference computes exactly what transformers writes down.
TOL_RANDOM = 2e-5
TOL_EXACT = 1e-12

# The fixture's exact ties in the pool top-k (k = 128 / 4 = 32): pools every indexer head's ReLU
# zeroes score exactly 0 on both sides of the 32nd place, and torch.topk (CPU) took these among them,
# {layer: {query: pools}}. Recorded by running torch.topk on this reference's scores, in transformers'
# [T, n_pools] shape, layer after layer. torch's choice depends on the row length (n_pools): the
# truth's greedy steps recompute the whole sequence (no cache), so each step has its own choices.
# With the lowest pools instead, `long` is 0.08 off from query 146 on (layer 7's first tie).
LONG_PREFILL_TIES = {
    3: {167: [1, 32, 33], 168: [12, 34], 182: [34], 184: [1, 21, 24, 26, 29, 42], 191: [1, 34, 36, 38, 42, 44],
        235: [38, 40], 275: [37, 39], 315: [15, 31, 32, 44, 55, 57, 60, 63], 316: [21, 51]},
    7: {146: [26, 29], 158: [1, 4, 6], 168: [12, 39], 197: [32, 34, 36], 203: [18, 31, 45],
        229: [18, 19, 20, 22, 25, 29, 30, 33, 35, 38, 40, 44, 46, 52, 54], 244: [5, 20, 21, 25, 26, 28, 34, 43, 48],
        250: [0, 25, 29, 34, 48, 61], 252: [1], 260: [10, 12, 44, 61], 265: [34],
        299: [1, 4, 5, 31, 32, 34, 42, 53, 55, 68, 73, 74], 303: [2, 13, 14, 15, 16, 20, 23, 42]},
}
# Greedy step s of `long` (prompt + s greedy tokens, n_pools (320 + s) // 4), its own choices: some
# prefill queries choose otherwise (or are no longer tied: layer 3's choices move layer 7's scores),
# and there are new queries. Step 8 (82 pools) is where transformers' own cached decode (one
# [1, 1, n_pools] row per step) leaves the truth, 1e-2 off: ties again. Step 1 is the prefill's.
LONG_STEP_TIES = {
    1: LONG_PREFILL_TIES,
    8: {3: {167: [1, 32, 33], 168: [12, 34], 182: [34], 184: [1, 21, 23, 26, 29, 42], 191: [1, 34, 36, 38, 42, 44],
            235: [38, 50], 275: [37, 39], 315: [31, 32, 44, 55, 57, 60, 63, 76], 316: [51, 68]},
        7: {146: [26, 29], 158: [1, 4, 6], 168: [14, 15], 197: [19, 34, 36], 203: [18, 31, 48],
            229: [18, 19, 20, 22, 25, 29, 30, 33, 35, 38, 40, 44, 46, 52, 54], 250: [0, 25, 29, 34, 48, 61], 252: [60],
            260: [10, 12, 60, 61], 265: [16], 299: [1, 5, 21, 27, 28, 31, 32, 34, 42, 53, 55, 73],
            303: [2, 13, 14, 15, 20, 42, 52, 55, 73], 326: [7, 8, 12, 14, 15, 18, 25, 27, 43, 61, 67, 77]}},
    31: {3: {167: [1, 32, 33], 168: [24, 34], 182: [34], 184: [1, 23, 24, 26, 29, 42], 191: [4, 34, 36, 38, 42, 44],
             235: [38, 43], 275: [37, 39], 315: [15, 31, 32, 44, 55, 57, 60, 76], 316: [21, 63], 343: [21, 27, 42, 62]},
         7: {146: [15, 26], 158: [1, 4, 6], 168: [4, 12, 15], 197: [32, 34, 36], 203: [31, 45, 48],
             229: [18, 19, 20, 22, 25, 29, 30, 33, 35, 38, 40, 44, 46, 52, 54], 250: [0, 13, 23, 25, 34, 48], 252: [1],
             260: [19, 44, 60, 61], 299: [1, 21, 31, 32, 34, 42, 53, 55, 68, 73, 74],
             303: [2, 13, 14, 20, 30, 42, 68, 73], 326: [7, 8, 12, 14, 15, 18, 25, 27, 43, 61, 67, 77]}},
}


def fixture_or_skip() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("TF_SHARED_GLM5_NEXT", SHARED.parent / "glm5_next"))
    if not path.is_dir():
        pytest.skip(f"{path} is absent: this check reads peer data too large to copy into tests/")
    return path


@pytest.fixture(scope="module")
def fixture():
    """(root, the reference model: its EXL3 weights decoded once, prompts, truth logits, greedy tokens)."""
    root = fixture_or_skip()
    truth = root / "dequant_ref" / "3.0bpw"
    return (root, glm5_next.Model(root / "exl3_3.0bpw"), json.loads((root / "prompts.json").read_text()),
            safetensors_io.load(truth / "dequant_fp32_logits.safetensors"),
            json.loads((truth / "dequant_fp32_greedy.json").read_text()))


def worst_position(logits: np.ndarray, expected: np.ndarray, positions=None) -> float:
    positions = range(len(expected)) if positions is None else positions
    return max(relative_l2(logits[t], expected[t]) for t in positions)


@pytest.mark.parametrize("name", ["chat", "short", "random"])
def test_reference_matches_transformers_on_the_fixture(fixture, name):
    """The prompt and its 32 greedy tokens in one forward: positions T-1 .. T+30 are the greedy steps.
    Exact here because no selection happens (at most 68 tokens, 17 pools <= 32): every step's
    recompute sees the same causal keys."""
    _, model, prompts, expected, greedy = fixture
    tokens, t = prompts[name], len(prompts[name])
    model.tie_breaks = {}
    logits, _ = model.forward(tokens + greedy[name][:-1])
    assert all(np.isinf(model.selection_margins(layer)).all() for layer in model.indexer_scores)  # all pools taken
    within(worst_position(logits, expected[name]), TOL, f"{name}: worst of {t} prefill positions")
    steps = expected[f"{name}__greedy_step_logits"]
    within(worst_position(logits[t - 1:], steps), TOL, f"{name}: worst of 32 greedy steps")
    assert logits[t - 1:].argmax(-1).tolist() == greedy[name]


def test_reference_matches_transformers_on_the_long_prompt(fixture):
    """320 tokens, 80 pools: sparse from query 131 on, with transformers' choices among exact ties."""
    _, model, prompts, expected, greedy = fixture
    tokens = prompts["long"]
    model.tie_breaks = LONG_PREFILL_TIES
    logits, _ = model.forward(tokens)
    within(worst_position(logits, expected["long"]), TOL, f"long: worst of {len(tokens)} prefill positions")
    assert logits[-1].argmax() == greedy["long"][0]  # greedy step 0 is the prefill's last position
    for layer, queries in LONG_PREFILL_TIES.items():
        margins = model.selection_margins(layer)
        assert all(margins[q] == 0.0 for q in queries)
        # The nearest other cut: measured 2.3e-6 (layer 7, query 294, scores 0.0498 there: 4.6e-5 relative,
        # against fp32's ~1e-7 and the hidden states' ~3e-6): no flip, as the logits show.
        assert np.min(margins[margins > 0]) > 1e-6


@pytest.mark.parametrize("step", sorted(LONG_STEP_TIES))
def test_reference_matches_the_long_greedy_steps(fixture, step):
    """Greedy step s of `long` recomputed as the truth did: the prompt and s greedy tokens, no cache."""
    _, model, prompts, expected, greedy = fixture
    model.tie_breaks = LONG_STEP_TIES[step]
    logits, _ = model.forward(prompts["long"] + greedy["long"][:step])
    within(relative_l2(logits[-1], expected["long__greedy_step_logits"][step]), TOL, f"long: greedy step {step}")
    assert logits[-1].argmax() == greedy["long"][step]


def test_pool_ties_are_the_only_difference(fixture):
    """Breaking the exact ties by lowest pool instead leaves every position before the first tied
    query exact, sparse ones included (131 .. 145), and the rest far off. (That every recorded choice
    is among exact ties is checked by kpool.select, which raises otherwise.)"""
    _, model, prompts, expected, _ = fixture
    tokens = prompts["long"]
    model.tie_breaks = {}
    logits, _ = model.forward(tokens)
    tie = model.first_near_tie()
    assert tie == min(min(q) for q in LONG_PREFILL_TIES.values()) == 146
    assert tie > (model.pool_top_k + 1) * model.config["index_kpool"] - 1  # past the first sparse query
    within(worst_position(logits, expected["long"], range(tie)), TOL,
           f"long: worst of the {tie} positions before the first tie")
    assert worst_position(logits, expected["long"], range(tie, len(tokens))) > 100 * TOL  # the ties do matter


def test_pool_selection_rules():
    """The selection's boundaries on a 10-token toy: pools of 4 (tokens 0-3, 4-7; 8-9 are no pool),
    a pool selectable once its last token is causal, the tail = the query's incomplete pool."""
    t, k = 10, 4
    scores = kpool.scores(np.ones((t, 1, 2)), np.ones((t // k, 2)), np.ones((t, 1)), t, k)
    assert scores.shape == (10, 2)
    assert np.isfinite(scores).tolist() == [[q >= 3, q >= 7] for q in range(t)]
    everything = kpool.select(scores, 2)
    causal = np.tril(np.ones((t, t), dtype=bool))
    assert np.array_equal(kpool.visible_tokens(everything, t, k, tail=True), causal)
    no_tail = kpool.visible_tokens(everything, t, k, tail=False)
    assert no_tail.sum(-1).tolist() == [0, 0, 0, 4, 4, 4, 4, 8, 8, 8]  # queries 0-2 select nothing
    one_pool = kpool.select(np.where(np.isfinite(scores), [[1.0, 2.0]], -np.inf), 1)
    visible = kpool.visible_tokens(one_pool, t, k, tail=True)
    assert np.flatnonzero(visible[7]).tolist() == [4, 5, 6, 7]  # 8 tokens: no tail, pool 1 outscores pool 0
    assert np.flatnonzero(visible[9]).tolist() == [4, 5, 6, 7, 8, 9]  # pool 1 + the tail 8-9
    # kpool 1: every token a pool, no tail; a query need not see itself (here all tie, the lowest wins)
    single = kpool.select(kpool.scores(np.ones((4, 1, 2)), np.ones((4, 2)), np.ones((4, 1)), 4, 1), 1)
    assert kpool.visible_tokens(single, 4, 1, tail=True).tolist() == [[True, False, False, False]] * 4
    assert kpool.selection_margins(np.array([[3.0, 1.0, 1.0, -np.inf]]), 1).tolist() == [2.0]
    assert kpool.selection_margins(np.array([[3.0, 1.0, 1.0, -np.inf]]), 2).tolist() == [0.0]
    assert kpool.selection_margins(np.array([[3.0, 1.0, -np.inf, -np.inf]]), 2).tolist() == [np.inf]


def test_config_defaults_follow_transformers():
    """Glm5NextTextConfig's schedules and the linear_attn_config override, traps included."""
    c = glm5_next.text_config({"text_config": {"num_hidden_layers": 8, "first_k_dense_replace": 1}})
    assert c["mlp_layer_types"] == ["dense"] * 3 + ["sparse"] * 5  # first_k_dense_replace is ignored
    assert [t[0] for t in c["layer_types"]] == list("llldllld") and c["indexer_types"] == ["full"] * 8
    assert c["index_kpool"] == 16 and c["index_kpool_always_select_tail"] and c["linear_lower_bound"] == -5.0
    null_bound = {"linear_lower_bound": None, "linear_attn_config": {"gate_lower_bound": None}}
    assert glm5_next.text_config({"text_config": null_bound})["linear_lower_bound"] == -5.0  # safe_gate
    softplus = {"linear_lower_bound": None, "linear_attn_config": {"gate_lower_bound": None, "safe_gate": False}}
    assert glm5_next.text_config({"text_config": softplus})["linear_lower_bound"] is None
    schedule = glm5_next.text_config({"text_config": {"num_hidden_layers": 6, "index_topk_freq": 2}})
    assert schedule["indexer_types"] == ["full", "full", "shared", "full", "shared", "full"]
    flat = glm5_next.text_config({"model_type": "glm5_next", "hidden_size": 64, "index_kpool": 2})
    assert flat["hidden_size"] == 64 and flat["index_kpool"] == 2


def test_tensor_name_forms_agree(tmp_path):
    """The same random weights stored as the peer does (fused qkv_proj, hc_attn_fn, self_attn.A_log),
    with q/k/v and their convs split, and under transformers' module names: identical logits."""
    config = variant_config("base")
    tokens = prompt(config)
    logits = [glm5_next.Model(write_model(tmp_path / form, config, form, seed=3)).forward(tokens)[0]
              for form in ("peer", "hf_split", "hf_modules")]
    assert np.array_equal(logits[0], logits[1]) and np.array_equal(logits[0], logits[2])


class Float64Casts:
    """Within: transformers' fp32 casts (`.float()`, `.to(torch.float32)`, `.type(torch.float32)`,
    eager attention's `softmax(dtype=torch.float32)`) give float64, so that a float64 model computes
    exactly what its fp32 code writes down."""

    def __init__(self, torch):
        self.torch, self.saved = torch, {}

    def __enter__(self):
        torch, tensor = self.torch, self.torch.Tensor
        self.saved = {name: getattr(tensor, name) for name in ("to", "type", "float")}
        self.softmax = softmax = torch.nn.functional.softmax
        to, type_ = self.saved["to"], self.saved["type"]
        wide = lambda args: tuple(torch.float64 if a is torch.float32 else a for a in args)  # noqa: E731

        def to64(x, *args, **kwargs):
            if kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
            return to(x, *wide(args), **kwargs)

        tensor.to = to64
        tensor.type = lambda x, *args, **kwargs: type_(x, *wide(args), **kwargs)
        tensor.float = lambda x: to(x, torch.float64)
        torch.nn.functional.softmax = lambda *args, dtype=None, **kwargs: softmax(
            *args, dtype=torch.float64 if dtype is torch.float32 else dtype, **kwargs)
        return self

    def __exit__(self, *exc):
        for name, method in self.saved.items():
            setattr(self.torch.Tensor, name, method)
        self.torch.nn.functional.softmax = self.softmax


def transformers_logits(model_dir, model: glm5_next.Model, tokens: list[int], attention: str,
                        float64: bool = False) -> np.ndarray:
    """transformers' forward (no cache) of the reference's own weights: fp32 as it runs, or float64
    throughout (its fp32 casts promoted, the experts' eager loop: grouped_mm has no float64)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (CI): the fixture tests stand in")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (CI)")
    config = transformers.AutoConfig.for_model(**json.loads((model_dir / "config.json").read_text()))
    torch.manual_seed(0)
    dtype = torch.float64 if float64 else torch.float32
    experts = {"experts_implementation": "eager"} if float64 else {}
    hf = transformers.AutoModelForImageTextToText.from_config(config, dtype=dtype, attn_implementation=attention,
                                                              **experts).eval()
    state = {}
    for name, tensor in hf.state_dict().items():
        key = name.replace("model.language_model.", "model.")
        prefix, leaf = key.rsplit(".", 1)
        if key.startswith("model.visual."):
            value = tensor.numpy()
        elif key.endswith("experts.gate_up_proj") or key.endswith("experts.down_proj"):
            parts = ["gate_proj", "up_proj"] if leaf == "gate_up_proj" else ["down_proj"]
            value = np.stack([np.concatenate([model.weight(f"{prefix}.{e}.{p}")[0].T for p in parts])
                              for e in range(tensor.shape[0])])
        elif key in model.tensors:
            value = model.vector(key)
        elif prefix.endswith(("q_proj", "k_proj", "v_proj")) and model.has_linear(prefix[:-6] + "qkv_proj"):
            i, rows = "qkv".index(prefix[-6]), tensor.shape[0]
            value = model.weight(prefix[:-6] + "qkv_proj")[0].T[i * rows:(i + 1) * rows, :tensor.shape[1]]
        else:
            value = model.weight(prefix)[0].T[:tensor.shape[0], :tensor.shape[1]]
        value = np.ascontiguousarray(value, dtype=np.float64 if float64 else np.float32)
        state[name] = torch.from_numpy(value).reshape(tensor.shape)
    hf.load_state_dict(state, strict=True)
    with torch.no_grad():
        if not float64:
            return hf(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].double().numpy()
        with Float64Casts(torch):
            return hf(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].numpy()


def torch_tie_breaks(model: glm5_next.Model, torch) -> dict:
    """torch.topk's choice among exactly tied pool scores, as transformers makes it: on the fp32
    scores in their [1, T, n_pools] shape, finfo.min where a pool is not selectable."""
    breaks, k = {}, model.pool_top_k
    for layer, scores in model.indexer_scores.items():
        masked = np.where(np.isfinite(scores), scores, np.finfo(np.float32).min).astype(np.float32)
        chosen = torch.from_numpy(masked)[None].topk(min(k, scores.shape[1]), dim=-1).indices[0].numpy()
        for query in np.flatnonzero(model.selection_margins(layer) == 0.0):
            kth = np.sort(scores[query])[::-1][k - 1]
            breaks.setdefault(layer, {})[int(query)] = sorted(int(p) for p in chosen[query] if scores[query, p] == kth)
    return breaks


def settled_forward(model: glm5_next.Model, tokens: list[int], torch) -> np.ndarray:
    """The forward with torch's tie choices; a tie broken otherwise changes the later layers' scores,
    so the layers are settled in order."""
    model.tie_breaks = {}
    for _ in range(model.config["num_hidden_layers"] + 1):
        logits, _ = model.forward(tokens)
        breaks = torch_tie_breaks(model, torch)
        changed = [layer for layer in sorted(set(breaks) | set(model.tie_breaks))
                   if breaks.get(layer) != model.tie_breaks.get(layer)]
        if not changed:
            return logits
        model.tie_breaks = {layer: b for layer, b in breaks.items() if layer <= changed[0]}
    raise AssertionError("the tie choices did not settle")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_reference_matches_transformers_on_random_checkpoints(tmp_path, variant):
    torch = pytest.importorskip("torch", reason="torch is not installed (CI): the fixture tests stand in")
    model_dir = write_variant(tmp_path / variant, variant, seed=5)
    tokens = prompt(variant_config(variant))
    # SDPA is transformers' default; no_tail also against eager, which differs where a query selects
    # nothing (queries 0-2 there): eager averages all T values, SDPA outputs 0.
    for attention, empty_rows in [("sdpa", "zero")] + [("eager", "uniform")] * (variant == "no_tail"):
        model = glm5_next.Model(model_dir, empty_rows=empty_rows)
        exact = transformers_logits(model_dir, model, tokens, attention, float64=True)
        fp32 = transformers_logits(model_dir, model, tokens, attention)
        logits = settled_forward(model, tokens, torch)
        margins = [model.selection_margins(layer) for layer in model.indexer_scores]
        assert min(np.min(m[m > 0], initial=np.inf) for m in margins) > 1e-6  # no near tie to flip in fp32
        what = f"{variant} ({attention}): worst of {len(tokens)} positions"
        within(worst_position(logits, exact), TOL_EXACT, f"{what} vs float64 transformers")
        within(worst_position(logits, fp32), TOL_RANDOM, f"{what} vs fp32 transformers")
