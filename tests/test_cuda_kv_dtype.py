"""The f16 and fp8 KV caches on the GPU: the exact answer and the CPU's same-dtype logits within the
dtype's budget (tests/kv_budgets.py; the stored bytes and the attention against float64 are
tf-cuda-test kv's checks); every row keeps its bits in any batch, chunking, split spread and prompt
tile; the MLA classes (rope, DSA selection, NoPE) run f16 and fp8 latent caches; tensor
parallelism carries the dtype to its worker. Skips, with the library's reason, where no GPU
is usable; docs/measurements.md records the runs."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import SHARED, relative_l2, within
from glm_fixtures import checkpoint_dir, model_config, prompts, reference_greedy, reference_logits
from kv_budgets import F16_TOL, FP8_MEDIAN_TOL

import trellisforge

AVAILABLE, REASON = trellisforge.cuda_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")
DTYPES = ["f16", "fp8"]


def errors(a, b) -> np.ndarray:
    return np.sort([relative_l2(a[t], b[t]) for t in range(len(a))])


def within_budget(kv_dtype: str, ours, reference, what: str) -> None:
    """Both stores round values the two backends computed to ~1e-6 apart, so a value sitting on a
    rounding boundary lands on either side: GPU vs CPU is held to the dtype's budget, not to f32's."""
    e = errors(ours, reference)
    if kv_dtype == "f32":  # both exact; they differ in summation order
        within(e[-1], 1e-4, f"{what}: every position")
    elif kv_dtype == "f16":
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


@pytest.mark.parametrize("kv_dtype", DTYPES)
@pytest.mark.parametrize("family", ["glm4_moe_lite", "glm_moe_dsa", "glm5_next"])
def test_mla_classes_run_f16_and_fp8_latent_caches(family, kv_dtype):
    """The MLA classes' latent in f16 (the default) and fp8 on the GPU against the CPU's same
    dtype: GLM-4.7-Flash's latent with rope, GLM-5.x's with the DSA selection (`long` left out: its
    indexer's exact ties, tests/test_mla_engine.py) and GLM-5.3-Flash's NoPE latent."""
    root = SHARED.parent / family
    if not root.is_dir():
        pytest.skip(f"{root} is absent: the MLA fixtures are read from ../shared")
    tokens_of = json.loads((root / "prompts.json").read_text())
    if family != "glm4_moe_lite":
        tokens_of.pop("long")
    gpu = trellisforge.Engine(root / "exl3_3.0bpw", backend="cuda", max_seqs=4, kv_dtype=kv_dtype)
    cpu = trellisforge.Engine(root / "exl3_3.0bpw", backend="cpu", max_seqs=4, kv_dtype=kv_dtype)
    assert gpu.stats()["kv_dtype"] == kv_dtype
    assert trellisforge.Engine(root / "exl3_3.0bpw", backend="cuda", max_seqs=1).stats()["kv_dtype"] == "f16"
    for name, tokens in tokens_of.items():
        within_budget(kv_dtype, gpu.logits(tokens), cpu.logits(tokens), f"{family} {name}: {kv_dtype} latent, GPU vs CPU")
    # Rows keep their bits in a batch and when the prompt arrives in chunks (the latent's fp8 rows
    # carry their own exponents, so an earlier row's codes never change).
    tokens = next(iter(tokens_of.values()))
    small = trellisforge.Engine(root / "exl3_3.0bpw", backend="cuda", max_seqs=2, rows_max=7, page_tokens=5, kv_dtype=kv_dtype)
    assert np.array_equal(small.logits(tokens), gpu.logits(tokens))


@pytest.mark.parametrize("kv_dtype", ["f32", *DTYPES])
def test_mla_long_prompt_spread_and_whole_blocks(monkeypatch, kv_dtype):
    """A 2100-token prompt through GLM-4.7-Flash's latent attention in 32-row chunks: each chunk
    spread over the splits (one, two and, past 2048 positions, three tiles each; up to 64 live, so
    the fold's scan runs both of its halves) gives the same bits as a block per row streaming its
    tiles through every split and folding them itself (an iteration of two tiles, or one at a
    split's odd end), both within budget of the CPU; the tokens sampled after it are the same too."""
    root = SHARED.parent / "glm4_moe_lite"
    if not root.is_dir():
        pytest.skip(f"{root} is absent: the MLA fixtures are read from ../shared")
    checkpoint = root / "exl3_3.0bpw"
    vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    prompt = [int(t) for t in np.random.default_rng(6).integers(10, vocab, 2100)]
    spread = trellisforge.Engine(checkpoint, backend="cuda", max_seqs=2, rows_max=32, kv_dtype=kv_dtype)
    monkeypatch.setenv("TF_CUDA_ATTENTION_SPREAD", "0")
    whole = trellisforge.Engine(checkpoint, backend="cuda", max_seqs=2, rows_max=32, kv_dtype=kv_dtype)
    on_spread = spread.logits(prompt)
    assert np.array_equal(on_spread.view(np.uint32), whole.logits(prompt).view(np.uint32))
    cpu = trellisforge.Engine(checkpoint, backend="cpu", max_seqs=2, kv_dtype=kv_dtype)
    within_budget(kv_dtype, on_spread, cpu.logits(prompt), f"glm4_moe_lite {kv_dtype} 2100-token prompt, GPU vs CPU")
    run = [[(e.token, e.logprob) for e in engine.stream(prompt, 12, temperature=0.8, seed=4, stop_token_ids=[])]
           for engine in (spread, whole)]
    assert run[0] == run[1] and len(run[0]) == 12


@pytest.mark.parametrize("kv_dtype", DTYPES)
def test_gpu_tp2_on_one_gpu_within_budget_of_the_cpu(monkeypatch, kv_dtype):
    """Tensor parallelism with the cache in f16 or fp8: rank 0 tells the worker the dtype; two
    ranks share the one GPU (the all-reduce over TCP) as in tests/test_cuda_tensor_parallel.py."""
    from server_process import free_port
    from test_tensor_parallel import start_worker
    monkeypatch.setenv("TRELLISFORGE_TP_COLLECTIVE", "tcp")
    monkeypatch.setenv("TRELLISFORGE_GPU", "0")
    directory = checkpoint_dir("3.0")
    master = f"127.0.0.1:{free_port()}"
    worker = start_worker(directory, 1, master, backend="cuda")
    try:
        engine = trellisforge.Engine(directory, backend="cuda", max_seqs=4, tp_world=2, tp_master=master, kv_dtype=kv_dtype)
        reference = trellisforge.Engine(directory, max_seqs=4, kv_dtype=kv_dtype)
        assert engine.stats()["kv_dtype"] == kv_dtype
        for name, tokens in prompts().items():
            within_budget(kv_dtype, engine.logits(tokens), reference.logits(tokens), f"{kv_dtype} GPU TP=2 vs CPU TP=1, {name}")
        engine.close()
        assert worker.wait(timeout=60) == 0, worker.stdout.read()
    finally:
        if worker.poll() is None:
            worker.kill()
