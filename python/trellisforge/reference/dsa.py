"""Class-C attention (GLM.md §3.6): MLA restricted per query to the keys the DSA lightning indexer
selects, as transformers 5.17 `GlmMoeDsaAttention` / `GlmMoeDsaIndexer` compute it. Records every
"full" layer's indexer scores so that a test can tell a near-tie selection flip from an error."""
from __future__ import annotations

import numpy as np

from . import rope
from .mla import MultiHeadLatentAttention

INDEXER_NORM_EPS = 1e-6  # nn.LayerNorm(index_head_dim, eps=1e-6), not rms_norm_eps


def indexer_types(config: dict) -> list[str]:
    """Per layer "full" (runs its indexer) or "shared" (reuses the latest full layer's selection):
    the explicit list, else index_topk_pattern ("FSS..."), else the index_topk_freq /
    index_skip_topk_offset schedule with transformers' defaults 1 and 2."""
    layers = config["num_hidden_layers"]
    if config.get("indexer_types") is not None:
        return list(config["indexer_types"])
    pattern = config.get("index_topk_pattern")
    if pattern is not None:
        return [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
    freq = max(config.get("index_topk_freq", 1), 1)
    offset = config.get("index_skip_topk_offset", 2)
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]


def select(scores: np.ndarray, top_k: int, tie_breaks: dict[int, list[int]] | None = None) -> np.ndarray:
    """[T, T] bool from [T, T] indexer scores (-inf above the diagonal): each query's top_k causal
    keys, all of them while there are at most top_k. Keys tied at the k-th score are an
    implementation's choice (exact ties are common: a key every head's ReLU zeroes scores exactly 0);
    this takes the lowest positions unless tie_breaks names, per query, the tied keys to take."""
    t = len(scores)
    chosen = np.argsort(-scores, axis=-1, kind="stable")[:, :min(top_k, t)]
    keep = np.zeros((t, t), dtype=bool)
    np.put_along_axis(keep, chosen, True, axis=-1)
    for query, keys in (tie_breaks or {}).items():
        row = scores[query]
        kth = np.sort(row)[::-1][top_k - 1]
        above = row > kth
        if not np.all(row[keys] == kth) or above.sum() + len(keys) != top_k:
            raise ValueError(f"query {query}: keys {keys} are not a completion of the top-{top_k} among its ties")
        keep[query] = above
        keep[query, keys] = True
    return keep & np.tril(np.ones((t, t), dtype=bool))


def selection_margins(scores: np.ndarray, top_k: int) -> np.ndarray:
    """Per query, the k-th best causal score minus the (k+1)-th (inf while every causal key fits):
    how far the selection is from flipping."""
    ordered = -np.sort(-scores, axis=-1)
    margins = np.full(len(scores), np.inf)
    rows = np.arange(len(scores)) >= top_k
    if top_k < len(scores):
        margins[rows] = ordered[rows, top_k - 1] - ordered[rows, top_k]
    return margins


class SparseLatentAttention(MultiHeadLatentAttention):
    """One forward's worth: holds the latest full layer's selection for the shared layers after it."""

    def __init__(self, model):
        super().__init__(model)
        c = model.config
        if self.q_lora_rank is None:
            raise NotImplementedError("glm_moe_dsa without q_lora_rank: the indexer reads the q latent")
        # Class C ignores rope_interleave and indexer_rope_interleave: both ropes are interleaved.
        self.interleaved = True
        self.types = indexer_types(c)
        self.top_k = c["index_topk"]
        self.index_heads, self.index_dim = c["index_n_heads"], c["index_head_dim"]
        self.scores: dict[int, np.ndarray] = {}
        self.selection: np.ndarray | None = None

    def indexer(self, prefix: str, x: np.ndarray, q_latent: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """I[t, s] = sum_h w[t, h] relu(q[t, h] . k[s] / sqrt(index_dim)), w = weights_proj(x) /
        sqrt(index_heads); -inf above the diagonal. Heads are [rope | nope], rope first."""
        m, t, r = self.model, len(x), self.rope_dim
        q = m.linear(f"{prefix}.wq_b", q_latent, self.index_heads * self.index_dim).reshape(t, self.index_heads, -1)
        k = m.linear(f"{prefix}.wk", x, self.index_dim)
        mean = k.mean(-1, keepdims=True)
        k = (k - mean) / np.sqrt(((k - mean) ** 2).mean(-1, keepdims=True) + INDEXER_NORM_EPS)
        k = k * m.vector(f"{prefix}.k_norm.weight") + m.vector(f"{prefix}.k_norm.bias")
        q = np.concatenate([self.rope(q[..., :r], positions), q[..., r:]], axis=-1)
        k = np.concatenate([self.rope(k[:, None, :r], positions)[:, 0], k[:, r:]], axis=-1)
        per_head = np.maximum(np.einsum("thd,sd->ths", q, k) * self.index_dim ** -0.5, 0.0)
        weights = m.linear(f"{prefix}.weights_proj", x, self.index_heads) * self.index_heads ** -0.5
        scores = np.einsum("th,ths->ts", weights, per_head)
        return np.where(np.tril(np.ones((t, t), dtype=bool)), scores, -np.inf)

    def visible_keys(self, layer: int, x: np.ndarray, q_latent: np.ndarray | None, positions: np.ndarray) -> np.ndarray:
        if self.types[layer] == "shared":
            if self.selection is None:
                raise ValueError(f"layer {layer} shares the indexer selection but no full layer precedes it")
            return self.selection
        self.scores[layer] = self.indexer(f"model.layers.{layer}.self_attn.indexer", x, q_latent, positions)
        self.selection = select(self.scores[layer], self.top_k, self.model.tie_breaks.get(layer))
        return self.selection
