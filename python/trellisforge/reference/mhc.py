"""Manifold-constrained hyper-connections (mHC) of glm5_next, as transformers 5.17
`Glm5NextTextHyperConnection` / `Glm5NextTextHyperHead` compute them: the residual is hc_mult
streams [T, H, D]; each sublayer reads a `pre`-weighted sum of them and writes
new[j] = post[j] * out + sum_i comb[i, j] * old[i]."""
from __future__ import annotations

import numpy as np


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def mappings(streams: np.ndarray, fn: np.ndarray, base: np.ndarray, scale: np.ndarray, iters: int,
             hc_eps: float, norm_eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pre [T, H], post [T, H], comb [T, H, H]) from streams [T, H, D], fn [(2+H)H, H*D], base
    [(2+H)H], scale [3]. The input norm is an unweighted RMSNorm over all H*D values with
    rms_norm_eps (not hc_eps); Sinkhorn as written: softmax over the last axis + hc_eps, one column
    normalization, then iters - 1 (row, column) rounds, each dividing by (sum + hc_eps)."""
    t, h, _ = streams.shape
    flat = streams.reshape(t, -1)
    flat = flat / np.sqrt(np.mean(flat * flat, axis=-1, keepdims=True) + norm_eps)
    mix = flat @ fn.T
    pre = sigmoid(mix[:, :h] * scale[0] + base[:h]) + hc_eps
    post = 2 * sigmoid(mix[:, h:2 * h] * scale[1] + base[h:2 * h])
    logits = mix[:, 2 * h:].reshape(t, h, h) * scale[2] + base[2 * h:].reshape(h, h)
    comb = np.exp(logits - logits.max(-1, keepdims=True))
    comb = comb / comb.sum(-1, keepdims=True) + hc_eps
    comb = comb / (comb.sum(-2, keepdims=True) + hc_eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdims=True) + hc_eps)
        comb = comb / (comb.sum(-2, keepdims=True) + hc_eps)
    return pre, post, comb


def collapse(pre: np.ndarray, streams: np.ndarray) -> np.ndarray:
    """The sublayer input [T, D]: sum_i pre[i] * stream[i] (of the raw streams, not the normed)."""
    return np.einsum("th,thd->td", pre, streams)


def expand(post: np.ndarray, comb: np.ndarray, out: np.ndarray, streams: np.ndarray) -> np.ndarray:
    """new[j] = post[j] * out + sum_i comb[i, j] * old[i] (torch: comb^T @ residual)."""
    return post[:, :, None] * out[:, None, :] + np.einsum("tij,tid->tjd", comb, streams)


def head(streams: np.ndarray) -> np.ndarray:
    """The final collapse: an unweighted mean over the streams (not DeepSeek-V4's weighted head)."""
    return streams.mean(axis=1)
