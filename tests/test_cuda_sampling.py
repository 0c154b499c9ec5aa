"""The GPU sampler (zig/kernels/cuda/sample.cu) against a float64 numpy reference of its
semantics: the kept set is the host sampler's (order by logit descending and id ascending; top-k,
then the shortest top-p prefix of those, then min-p), and u picks the kept token whose interval
in id order holds u x (kept weight). Ties, determinism and bad input too; then the engine: rows
sampled with temperature run on the GPU, reproducibly, and TF_CUDA_SAMPLING=0 keeps them on the
host. The GPU tests skip without a usable GPU; the bad-input checks run everywhere."""
from __future__ import annotations

import numpy as np
import pytest
from glm_fixtures import checkpoint_dir, prompts

import trellisforge
from trellisforge.gpu_sampling import cuda_sample

AVAILABLE, REASON = trellisforge.cuda_available()
gpu = pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")
# Slack of the interval check: the kernel's weights are f32 exps rounded to multiples of 2^-40.
SLACK = 1e-5


def reference(logits: np.ndarray, temperature: float, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0):
    """(kept token ids in id order, their probabilities renormalised over the kept set)."""
    l64 = logits.astype(np.float64)
    vocab = len(l64)
    order = np.lexsort((np.arange(vocab), -l64))
    p = np.exp((l64 - l64.max()) / temperature)
    n = vocab if top_k == 0 else min(top_k, vocab)
    if top_p < 1:
        cumulative = np.cumsum(p[order[:n]])
        n = int(np.argmax(cumulative >= top_p * cumulative[-1])) + 1
    if min_p > 0:
        n = min(n, int(np.sum(p[order] >= min_p)))
    kept = np.sort(order[:n])
    weights = p[kept]
    return kept, weights / weights.sum()


def assert_interval(token: int, u: float, kept: np.ndarray, probabilities: np.ndarray, what: str):
    assert token in set(kept.tolist()), f"{what}: token {token} is not in the kept set"
    at = int(np.searchsorted(kept, token))
    before = float(probabilities[:at].sum())
    assert before - SLACK <= u <= before + probabilities[at] + SLACK, f"{what}: u {u} outside [{before}, {before + probabilities[at]}]"


@gpu
def test_random_rows_against_the_reference():
    rng = np.random.default_rng(3)
    rows, vocab = 6, 5000
    logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    settings = [
        dict(temperature=1.0),
        dict(temperature=0.7, top_p=0.95),
        dict(temperature=0.7, top_p=0.5, top_k=40),
        dict(temperature=1.3, top_k=7),
        dict(temperature=0.9, min_p=0.05),
        dict(temperature=0.6, top_p=0.8, top_k=100, min_p=0.02),
    ]
    jobs = []
    for row in range(rows):
        for setting in settings:
            for u in (0.0, 0.013, 0.25, 0.5, 0.731, 0.999):
                jobs.append(dict(row=row, u=u, **setting))
    choices = cuda_sample(logits, jobs)
    log_total = np.log(np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True)).sum(axis=1)) + logits.max(axis=1)
    for job, (token, logprob) in zip(jobs, choices):
        setting = {k: v for k, v in job.items() if k not in ("row", "u")}
        kept, probabilities = reference(logits[job["row"]], **setting)
        assert_interval(token, job["u"], kept, probabilities, str(job))
        assert abs(logprob - (float(logits[job["row"], token]) - log_total[job["row"]])) < 1e-5
    assert cuda_sample(logits, jobs) == choices  # the same rows and draws give the same tokens


@gpu
def test_the_draws_follow_the_kept_distribution():
    rng = np.random.default_rng(4)
    logits = (rng.standard_normal((1, 300)) * 2).astype(np.float32)
    n = 4000
    jobs = [dict(row=0, temperature=0.8, top_p=0.9, u=(j + 0.5) / n) for j in range(n)]
    tokens = np.array([t for t, _ in cuda_sample(logits, jobs)])
    kept, probabilities = reference(logits[0], 0.8, top_p=0.9)
    counts = np.array([(tokens == t).sum() for t in kept]) / n
    assert np.abs(counts - probabilities).max() <= 1.5 / n + SLACK
    assert set(tokens.tolist()) <= set(kept.tolist())


@gpu
def test_ties_keep_the_lowest_ids():
    flat = np.zeros((1, 1000), dtype=np.float32)
    tokens = {t for t, _ in cuda_sample(flat, [dict(row=0, temperature=1.0, top_k=5, u=(j + 0.5) / 50) for j in range(50)])}
    assert tokens == {0, 1, 2, 3, 4}
    # Ten tokens share the top logit; top_p 0.35 needs four of them (each carries a tenth), the
    # four lowest ids among them.
    logits = np.full((1, 64), -40.0, dtype=np.float32)
    top = np.array([60, 3, 17, 44, 9, 51, 23, 38, 12, 30])
    logits[0, top] = 2.0
    tokens = {t for t, _ in cuda_sample(logits, [dict(row=0, temperature=1.0, top_p=0.35, u=(j + 0.5) / 80) for j in range(80)])}
    assert tokens == set(np.sort(top)[:4].tolist())


@gpu
def test_a_full_vocabulary_spread_over_many_blocks():
    """GLM's 151552-token rows span 37 blocks: each cut-off is found a digit at a time across them
    and the draw walks the block that holds u. Rows: spread logits; a flat row (every token in one
    bin, ties across every block); few distinct values (tie groups of thousands crossing blocks)."""
    rng = np.random.default_rng(5)
    vocab = 151552
    logits = np.stack([
        (rng.standard_normal(vocab) * 3).astype(np.float32),
        np.zeros(vocab, dtype=np.float32),
        np.round(rng.standard_normal(vocab) * 2).astype(np.float32),
    ])
    settings = [
        dict(temperature=0.7, top_p=0.95),
        dict(temperature=1.0, top_k=50),
        dict(temperature=0.8, top_p=0.625, top_k=70000),  # 0.625 is exact in f32 and f64: the flat row keeps 43750
        dict(temperature=1.0, min_p=0.1),
        dict(temperature=1.0),
    ]
    jobs = [dict(row=row, u=u, **setting) for row in range(3) for setting in settings for u in (0.0, 0.3, 0.77, 0.9999)]
    choices = cuda_sample(logits, jobs)
    log_total = np.log(np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True)).sum(axis=1)) + logits.max(axis=1)
    references = {}
    for job, (token, logprob) in zip(jobs, choices):
        setting = {k: v for k, v in job.items() if k not in ("row", "u")}
        key = (job["row"], tuple(sorted(setting.items())))
        if key not in references:
            references[key] = reference(logits[job["row"]], **setting)
        assert_interval(token, job["u"], *references[key], str(job))
        assert abs(logprob - (float(logits[job["row"], token]) - log_total[job["row"]])) < 1e-5
    flat_top_k = [token for job, (token, _) in zip(jobs, choices) if job["row"] == 1 and job.get("top_k") == 50]
    assert max(flat_top_k) < 50
    # A job's token does not depend on the jobs beside it.
    alone = [cuda_sample(logits, [job])[0] for job in jobs[::7]]
    assert alone == choices[::7]


@gpu
def test_ties_across_blocks_keep_the_lowest_ids():
    """Ten tokens share the top logit in five blocks of 4096 tokens; a cut-off inside them keeps
    the lowest ids, wherever their blocks are."""
    vocab = 20000
    logits = np.full((1, vocab), -40.0, dtype=np.float32)
    top = np.array([19999, 4095, 4096, 8191, 12288, 17, 16383, 9000, 2, 15000])
    logits[0, top] = 2.0
    lowest = np.sort(top)
    draws = [(j + 0.5) / 120 for j in range(120)]
    for setting, kept in [
        (dict(top_k=4), lowest[:4]),
        (dict(top_p=0.35), lowest[:4]),
        (dict(top_p=0.65, top_k=9), lowest[:6]),
        (dict(min_p=0.5), lowest),
    ]:
        tokens = {t for t, _ in cuda_sample(logits, [dict(row=0, temperature=1.0, u=u, **setting) for u in draws])}
        assert tokens == set(kept.tolist()), setting


@pytest.mark.parametrize("bad, message", [
    (dict(row=2, temperature=1.0, u=0.5), "logits row"),
    (dict(row=0, temperature=0.0, u=0.5), "temperature"),
    (dict(row=0, temperature=1.0, top_p=0.0, u=0.5), "top_p"),
    (dict(row=0, temperature=1.0, top_k=-1, u=0.5), "top_k"),
    (dict(row=0, temperature=1.0, min_p=1.5, u=0.5), "min_p"),
    (dict(row=0, temperature=1.0, u=1.0), "u must be"),
])
def test_bad_jobs_are_refused_with_a_reason(bad, message):
    """Checked before any GPU is opened: this runs on machines without one too."""
    with pytest.raises(trellisforge.TrellisError, match=message):
        cuda_sample(np.zeros((2, 10), dtype=np.float32), [bad])


@gpu
def test_the_engine_samples_on_the_gpu_reproducibly(monkeypatch):
    tokens = prompts()["chat"]
    engine = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, kv_dtype="f32")
    first = engine.generate(tokens, 16, temperature=0.8, top_p=0.9, seed=21, stop_token_ids=[])
    again = engine.generate(tokens, 16, temperature=0.8, top_p=0.9, seed=21, stop_token_ids=[])
    assert first == again and len(first) == 16
    assert engine.stats()["gpu_sampled"] == 32
    # Alternatives need the whole row: those rows stay on the host.
    engine.generate(tokens, 4, temperature=0.8, seed=21, top_logprobs=2, stop_token_ids=[])
    assert engine.stats()["gpu_sampled"] == 32
    monkeypatch.setenv("TF_CUDA_SAMPLING", "0")
    host = trellisforge.Engine(checkpoint_dir("3.0"), backend="cuda", max_seqs=2, kv_dtype="f32")
    assert len(host.generate(tokens, 16, temperature=0.8, top_p=0.9, seed=21, stop_token_ids=[])) == 16
    assert host.stats()["gpu_sampled"] == 0
