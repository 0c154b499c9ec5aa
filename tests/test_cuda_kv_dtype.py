"""The f16 and fp8 KV caches on the GPU: the exact answer and the CPU's same-dtype logits within the
dtype's budget (tests/kv_budgets.py; the stored bytes and the attention against float64 are
tf-cuda-test kv's checks); every row keeps its bits in any batch, chunking, split spread and prompt
tile; MLA classes run an f16 latent cache and refuse fp8 by name. Skips, with the library's reason,
where no GPU is usable."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SHARED, relative_l2, within
from glm_fixtures import checkpoint_dir, model_config, prompts, reference_greedy, reference_logits
from kv_budgets import F16_TOL, FP8_MEDIAN_TOL

import trellisforge
from trellisforge import TrellisError

AVAILABLE, REASON = trellisforge.cuda_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")
DTYPES = ["f16", "fp8"]


def errors(a, b) -> np.ndarray:
    return np.sort([relative_l2(a[t], b[t]) for t in range(len(a))])


def within_budget(kv_dtype: str, ours, reference, what: str) -> None:
    """Both stores round values the two backends computed to ~1e-6 apart, so a value sitting on a
    rounding boundary lands on either side: GPU vs CPU is held to the dtype's budget, not to f32's."""
    e = errors(ours, reference)
    if kv_dtype == "f16":
        within(e[-2] if len(e) > 1 else e[-1], F16_TOL, f"{what}: all positions but one")
    else:
        within(float(np.median(e)), FP8_MEDIAN_TOL, f"{what}: median position")


@pytest.mark.parametrize("kv_dtype", DTYPES)
def test_gpu_logits_within_budget_and_rows_keep_their_bits(kv_dtype):
    gpu = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=4, kv_dtype=kv_dtype)
    cpu = trellisforge.Engine(checkpoint_dir("3.0"), backend="cpu", max_seqs=4, kv_dtype=kv_dtype)
    exact, greedy = reference_logits("3.0"), reference_greedy("3.0")
    for name, tokens in prompts().items():
        on_gpu = gpu.logits(tokens)
        within_budget(kv_dtype, on_gpu, exact[name], f"{kv_dtype} {name}: GPU vs exact")
        within_budget(kv_dtype, on_gpu, cpu.logits(tokens), f"{kv_dtype} {name}: GPU vs CPU")
        generated = gpu.generate(tokens, 32, stop_token_ids=[])
        common = next((i for i, (a, b) in enumerate(zip(generated, greedy[name])) if a != b), 32)
        print(f"{kv_dtype} {name}: GPU greedy equal to the exact answer's for {common} of 32 tokens")
    p = prompts()
    alone = gpu.logits(p["short"])
    batched = gpu.logits_batch([p["long"], p["short"], p["chat"]])[1]
    assert np.array_equal(alone.view(np.uint32), batched.view(np.uint32))
    small_steps = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, rows_max=7, page_tokens=5, kv_dtype=kv_dtype)
    assert np.array_equal(small_steps.logits(p["long"]).view(np.uint32), gpu.logits(p["long"]).view(np.uint32))
    stats = gpu.stats()
    assert stats["kv_dtype"] == kv_dtype and stats["pages_free"] == stats["pages_total"]


@pytest.mark.parametrize("kv_dtype", DTYPES)
def test_long_prompt_on_tiles_splits_and_whole_blocks(monkeypatch, kv_dtype):
    """A 1500-token prompt in 32-row chunks: the prompt tiles, the decode kernel spread over splits
    and folded in the block are all within budget of the CPU; spread and whole give the same bits,
    for the prompt and the tokens generated after it."""
    rng = np.random.default_rng(5)
    prompt = [int(t) for t in rng.integers(10, model_config("3.0")["vocab_size"], 1500)]
    tiled = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, rows_max=32, kv_dtype=kv_dtype)
    monkeypatch.setenv("TF_CUDA_PROMPT_ATTENTION", "0")
    spread = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, rows_max=32, kv_dtype=kv_dtype)
    monkeypatch.setenv("TF_CUDA_ATTENTION_SPREAD", "0")
    whole = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, rows_max=32, kv_dtype=kv_dtype)
    cpu = trellisforge.Engine(checkpoint_dir("3.0"), backend="cpu", max_seqs=2, kv_dtype=kv_dtype)
    on_spread = spread.logits(prompt)
    assert np.array_equal(on_spread.view(np.uint32), whole.logits(prompt).view(np.uint32))
    on_cpu = cpu.logits(prompt)
    within_budget(kv_dtype, on_spread, on_cpu, f"{kv_dtype} 1500-token prompt, decode kernel vs CPU")
    within_budget(kv_dtype, tiled.logits(prompt), on_cpu, f"{kv_dtype} 1500-token prompt, prompt tiles vs CPU")
    run = [[(e.token, e.logprob) for e in engine.stream(prompt, 12, temperature=0.8, seed=4, stop_token_ids=[])]
           for engine in (spread, whole)]
    assert run[0] == run[1] and len(run[0]) == 12


def test_mla_runs_an_f16_latent_cache_and_refuses_fp8():
    root = SHARED.parent / "glm4_moe_lite"
    if not root.is_dir():
        pytest.skip(f"{root} is absent: the MLA fixtures are read from ../shared")
    tokens_of = json.loads((root / "prompts.json").read_text())
    gpu = trellisforge.Engine(root / "exl3_3.0bpw", backend="cuda", max_seqs=4)
    cpu = trellisforge.Engine(root / "exl3_3.0bpw", backend="cpu", max_seqs=4)
    assert gpu.stats()["kv_dtype"] == "f16"
    for name, tokens in tokens_of.items():
        within_budget("f16", gpu.logits(tokens), cpu.logits(tokens), f"glm4_moe_lite {name}: f16 latent, GPU vs CPU")
    with pytest.raises(TrellisError, match="fp8 runs MLA models on the cpu backend only"):
        trellisforge.Engine(root / "exl3_3.0bpw", backend="cuda", max_seqs=2, kv_dtype="fp8")
