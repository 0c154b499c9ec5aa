"""The GPU sampler over given logits rows, through the C ABI (tf_cuda_sample): for tests of the
kernel against a reference. The engine uses the same kernel for rows sampled with temperature,
top-k, top-p and min-p only."""
from __future__ import annotations

import numpy as np

from ._ffi import check, ffi, lib


def cuda_sample(logits: np.ndarray, jobs: list[dict]) -> list[tuple[int, float]]:
    """logits: (rows, vocab) float32. Each job: row, temperature, u in [0, 1), and optionally top_p,
    top_k, min_p. Returns (token, log-probability) per job."""
    values = np.ascontiguousarray(logits, dtype=np.float32)
    if values.ndim != 2:
        raise ValueError("logits must be (rows, vocab)")
    rows, vocab = values.shape
    table = ffi.new("tf_sample_job[]", max(len(jobs), 1))
    for entry, job in zip(table, jobs):
        entry.row = job["row"]
        entry.temperature = job["temperature"]
        entry.top_p = job.get("top_p", 1.0)
        entry.top_k = job.get("top_k", 0)
        entry.min_p = job.get("min_p", 0.0)
        entry.u = job["u"]
    out = ffi.new("tf_sample_choice[]", max(len(jobs), 1))
    check(lib.tf_cuda_sample(ffi.cast("const float *", ffi.from_buffer(values)), rows, vocab, table, len(jobs), out))
    return [(int(out[i].token), float(out[i].logprob)) for i in range(len(jobs))]
