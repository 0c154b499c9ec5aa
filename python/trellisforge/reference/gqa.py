"""Class-A attention (GLM.md §3.3): grouped-query heads, optional q/k RMSNorm, partial rotate-half
RoPE on the first rotary_dim dims of each head."""
from __future__ import annotations

import numpy as np

from . import rope


class GroupedQueryAttention:
    def __init__(self, model):
        c = model.config
        params = c.get("rope_parameters") or {}
        self.model = model
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads", self.heads)
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        fraction = c.get("partial_rotary_factor", params.get("partial_rotary_factor", 0.5))
        self.rotary_dim = rope.rotated_dims(c, int(self.head_dim * fraction), self.head_dim)
        # Class A's default partial_rotary_factor is 0.5 (its config's), not transformers' generic 1.0.
        self.inv_freq, self.attention_factor = rope.frequencies({**c, "partial_rotary_factor": fraction}, self.rotary_dim)

    def rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        out = x.copy()
        out[..., :self.rotary_dim] = rope.rotate(x[..., :self.rotary_dim], positions, self.inv_freq, interleaved=False,
                                                 attention_factor=self.attention_factor)
        return out

    def __call__(self, layer: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        m, prefix = self.model, f"model.layers.{layer}.self_attn"
        t, d = len(x), self.head_dim
        q = m.linear(f"{prefix}.q_proj", x, self.heads * d).reshape(t, self.heads, d)
        k = m.linear(f"{prefix}.k_proj", x, self.kv_heads * d).reshape(t, self.kv_heads, d)
        v = m.linear(f"{prefix}.v_proj", x, self.kv_heads * d).reshape(t, self.kv_heads, d)
        if m.config.get("use_qk_norm"):
            q = m.rms_norm(q, m.vector(f"{prefix}.q_norm.weight"))
            k = m.rms_norm(k, m.vector(f"{prefix}.k_norm.weight"))
        q, k = self.rope(q, positions), self.rope(k, positions)
        group = self.heads // self.kv_heads
        out = np.empty((t, self.heads, d))
        causal = np.triu(np.full((t, t), -np.inf), 1)
        for h in range(self.heads):
            scores = q[:, h] @ k[:, h // group].T / np.sqrt(d) + causal
            p = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, h // group]
        return m.linear(f"{prefix}.o_proj", out.reshape(t, -1), m.hidden)
