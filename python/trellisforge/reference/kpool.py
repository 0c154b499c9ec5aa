"""The k-pool DSA indexer of glm5_next (GLM-5.3-Flash), as transformers 5.17 `Glm5NextTextIndexer`
computes it for one unpadded prompt: the indexer scores pools of `index_kpool` consecutive tokens
(a learned softmax average of their keys), each query takes its top index_topk / index_kpool
visible pools, and with `index_kpool_always_select_tail` also every token of its own incomplete
pool. NoPE: no rope anywhere in the indexer."""
from __future__ import annotations

import numpy as np

INDEXER_NORM_EPS = 1e-6  # nn.LayerNorm(index_head_dim, eps=1e-6), not rms_norm_eps


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = INDEXER_NORM_EPS) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * weight + bias


def pool_keys(k: np.ndarray, gate: np.ndarray, ape: np.ndarray) -> np.ndarray:
    """[n_pools, dim] from keys k [T, dim] and gate scores gate [T, dim] (x @ compress_gate.T): pool p
    is tokens p*kpool .. p*kpool + kpool - 1, its key per channel sum_j softmax_j(gate + ape[j]) k.
    Only complete pools exist (transformers drops the incomplete last one: `keep`)."""
    kpool = len(ape)
    tokens = np.arange(len(k) // kpool * kpool).reshape(-1, kpool)
    logits = gate[tokens] + ape[None]
    p = np.exp(logits - logits.max(1, keepdims=True))
    return ((p / p.sum(1, keepdims=True)) * k[tokens]).sum(1)


def visible_pools(t: int, n_pools: int, kpool: int) -> np.ndarray:
    """[T, n_pools] bool: a pool is selectable by a query once its last token is causal to it."""
    return (np.arange(n_pools)[None, :] + 1) * kpool - 1 <= np.arange(t)[:, None]


def scores(q: np.ndarray, keys: np.ndarray, weights: np.ndarray, t: int, kpool: int) -> np.ndarray:
    """I[t, p] = sum_h w[t, h] relu(q[t, h] . key[p] / sqrt(dim)), w = weights_proj(x) / sqrt(heads)
    already; -inf where pool p is not selectable by query t. q [T, heads, dim], keys [P, dim]."""
    per_head = np.maximum(np.einsum("thd,pd->thp", q, keys) * q.shape[-1] ** -0.5, 0.0)
    out = np.einsum("th,thp->tp", weights, per_head)
    return np.where(visible_pools(t, len(keys), kpool), out, -np.inf)


def select(scores: np.ndarray, top_k: int, tie_breaks: dict[int, list[int]] | None = None) -> np.ndarray:
    """[T, P] bool: each query's top_k selectable pools (all of them while there are at most top_k).
    Pools tied at the k-th score are an implementation's choice (exact ties are common: a pool every
    head's ReLU zeroes scores exactly 0); this takes the lowest pools unless tie_breaks names, per
    query, the tied pools to take."""
    t, n = scores.shape
    keep = np.zeros((t, n), dtype=bool)
    if n == 0 or top_k == 0:
        return keep
    chosen = np.argsort(-scores, axis=-1, kind="stable")[:, :min(top_k, n)]
    np.put_along_axis(keep, chosen, True, axis=-1)
    for query, pools in (tie_breaks or {}).items():
        row = scores[query]
        kth = np.sort(row)[::-1][top_k - 1]
        above = row > kth
        if not np.all(row[pools] == kth) or above.sum() + len(pools) != top_k:
            raise ValueError(f"query {query}: pools {pools} are not a completion of the top-{top_k} among its ties")
        keep[query] = above
        keep[query, pools] = True
    return keep & np.isfinite(scores)


def selection_margins(scores: np.ndarray, top_k: int) -> np.ndarray:
    """Per query, the k-th best selectable pool score minus the (k+1)-th (inf while every selectable
    pool fits): how far the selection is from flipping. 0 marks an exact tie across the cut."""
    margins = np.full(len(scores), np.inf)
    if scores.shape[1] <= top_k:
        return margins
    ordered = -np.sort(-scores, axis=-1)
    rows = np.isfinite(ordered[:, top_k])
    margins[rows] = ordered[rows, top_k - 1] - ordered[rows, top_k]
    return margins


def visible_tokens(selection: np.ndarray, t: int, kpool: int, tail: bool) -> np.ndarray:
    """[T, T] bool from the pool selection [T, P]: the selected pools' tokens, and with `tail` the
    query's own incomplete pool, tokens (t+1) - (t+1) % kpool .. t (empty when t+1 is a multiple of
    kpool: then the query's own, complete pool is visible only if selected). kpool 1 has no tail."""
    keep = np.zeros((t, t), dtype=bool)
    n = selection.shape[1]
    keep[:, :n * kpool] = np.repeat(selection, kpool, axis=1)
    if tail and kpool > 1:
        query = np.arange(t)
        start = (query + 1) - (query + 1) % kpool
        keep |= (np.arange(t)[None, :] >= start[:, None]) & (np.arange(t)[None, :] <= query[:, None])
    return keep
