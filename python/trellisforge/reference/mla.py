"""Multi-head latent attention of classes B and C (GLM.md §3.5), as transformers 5.17
`Glm4MoeLiteAttention` computes it, expanded (no weight absorption): every head's keys and values
come out of kv_b_proj, so the per-head scores are written down directly."""
from __future__ import annotations

import numpy as np

from . import rope

# transformers builds q_a_layernorm and kv_a_layernorm without passing rms_norm_eps.
LATENT_NORM_EPS = 1e-6


class MultiHeadLatentAttention:
    def __init__(self, model):
        c = model.config
        self.model = model
        self.heads = c["num_attention_heads"]
        self.q_lora_rank = c.get("q_lora_rank")
        self.kv_lora_rank = c["kv_lora_rank"]
        self.nope, self.rope_dim, self.v_dim = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        # The rotary embedding's head_dim is qk_rope_head_dim. Class C's plain rope ignores a partial
        # factor; elsewhere it leaves cos/sin shorter than the rope slice: transformers cannot run it.
        params = rope.parameters(c)
        ignored = c["model_type"] == "glm_moe_dsa" and params["rope_type"] == "default"
        if params.get("partial_rotary_factor", 1.0) != 1.0 and not ignored:
            raise NotImplementedError("partial_rotary_factor with MLA")
        self.inv_freq, self.attention_factor = rope.frequencies(c, self.rope_dim)
        self.scale = rope.softmax_scale(c, self.nope + self.rope_dim)
        self.interleaved = c.get("rope_interleave", True)

    def rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return rope.rotate(x, positions, self.inv_freq, self.interleaved, self.attention_factor)

    def queries(self, prefix: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """q [T, heads, nope + rope] and the normalized q latent (None without q_lora_rank)."""
        m, width = self.model, self.heads * (self.nope + self.rope_dim)
        if self.q_lora_rank is None:
            latent = None
            q = m.linear(f"{prefix}.q_proj", x, width)
        else:
            latent = m.rms_norm(m.linear(f"{prefix}.q_a_proj", x, self.q_lora_rank),
                                m.vector(f"{prefix}.q_a_layernorm.weight"), LATENT_NORM_EPS)
            q = m.linear(f"{prefix}.q_b_proj", latent, width)
        return q.reshape(len(x), self.heads, -1), latent

    def keys_values(self, prefix: str, x: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(k_nope [T, heads, nope], the shared rotated k_rope [T, rope], v [T, heads, v])."""
        m = self.model
        compressed = m.linear(f"{prefix}.kv_a_proj_with_mqa", x, self.kv_lora_rank + self.rope_dim)
        latent = m.rms_norm(compressed[:, :self.kv_lora_rank], m.vector(f"{prefix}.kv_a_layernorm.weight"), LATENT_NORM_EPS)
        kv = m.linear(f"{prefix}.kv_b_proj", latent, self.heads * (self.nope + self.v_dim)).reshape(len(x), self.heads, -1)
        k_rope = self.rope(compressed[:, None, self.kv_lora_rank:], positions)[:, 0]
        return kv[..., :self.nope], k_rope, kv[..., self.nope:]

    def visible_keys(self, layer: int, x: np.ndarray, q_latent: np.ndarray | None, positions: np.ndarray) -> np.ndarray:
        """[T, T] bool: which keys each query attends to. Dense MLA: the causal ones."""
        return np.tril(np.ones((len(x), len(x)), dtype=bool))

    def __call__(self, layer: int, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        m, prefix = self.model, f"model.layers.{layer}.self_attn"
        q, q_latent = self.queries(prefix, x)
        q_nope, q_rope = q[..., :self.nope], self.rope(q[..., self.nope:], positions)
        k_nope, k_rope, v = self.keys_values(prefix, x, positions)
        mask = np.where(self.visible_keys(layer, x, q_latent, positions), 0.0, -np.inf)
        out = np.empty((len(x), self.heads, self.v_dim))
        for h in range(self.heads):
            scores = (q_nope[:, h] @ k_nope[:, h].T + q_rope[:, h] @ k_rope.T) * self.scale + mask
            p = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, h]
        return m.linear(f"{prefix}.o_proj", out.reshape(len(x), -1), m.hidden)
