"""Kimi delta attention (KDA), the linear-attention layers of glm5_next, as transformers 5.17
`Glm5NextTextLinearAttention` computes it, in the per-token recurrent form (exact; transformers'
prefill uses the chunked form, equal up to rounding)."""
from __future__ import annotations

import numpy as np

L2NORM_EPS = 1e-6  # l2norm(x) = x / sqrt(sum(x * x) + 1e-6), in the kernel, after the fp32 casts


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def l2norm(x: np.ndarray, eps: float = L2NORM_EPS) -> np.ndarray:
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + eps)


def causal_conv(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Depthwise causal conv1d, no bias: out[t, c] = sum_j weight[c, j] x[t - K + 1 + j, c] (zeros
    before the prompt), x [T, C], weight [C, K]."""
    k = weight.shape[1]
    padded = np.concatenate([np.zeros((k - 1, x.shape[1])), x])
    return sum(weight[:, j] * padded[j:j + len(x)] for j in range(k))


def forget_gate(raw: np.ndarray, a_log: np.ndarray, lower_bound: float | None) -> np.ndarray:
    """Per-channel log decay g [T, heads, dim] from raw = f_b(f_a(x)) + dt_bias: with a lower bound
    lb * sigmoid(exp(A_log) raw) (in (lb, 0)); without, -exp(A_log) softplus(raw), softplus taken as
    raw itself above 20 as transformers does."""
    rate = np.exp(a_log)[None, :, None]
    if lower_bound is not None:
        return lower_bound * sigmoid(rate * raw)
    softplus = np.where(raw > 20.0, raw, np.log1p(np.exp(np.minimum(raw, 20.0))))
    return -rate * softplus


def delta_rule(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """The gated delta rule, per token, state S [heads, dk, dv] from zero:
    S = diag(exp(g_t)) S; S += k_t (beta_t (v_t - S^T k_t))^T; o_t = S^T q_t. q and k already
    l2-normalized, q scaled."""
    t, heads, dk = k.shape
    state = np.zeros((heads, dk, v.shape[-1]))
    out = np.empty_like(v)
    for i in range(t):
        state = state * np.exp(g[i])[:, :, None]
        delta = (v[i] - np.einsum("hkv,hk->hv", state, k[i])) * beta[i][:, None]
        state = state + k[i][:, :, None] * delta[:, None, :]
        out[i] = np.einsum("hkv,hk->hv", state, q[i])
    return out


class KimiDeltaAttention:
    def __init__(self, model):
        c = model.config
        self.model = model
        self.heads, self.dim = c["linear_num_heads"], c["linear_head_dim"]
        self.width = self.heads * self.dim
        self.lower_bound = c["linear_lower_bound"]
        self.eps = c["rms_norm_eps"]  # o_norm: rms_norm_eps

    def projections(self, prefix: str, x: np.ndarray) -> np.ndarray:
        """[T, 3 * width] = [q | k | v]: the fused qkv_proj (the peer's form) or the three."""
        m = self.model
        if m.has_linear(f"{prefix}.qkv_proj"):
            return m.linear(f"{prefix}.qkv_proj", x, 3 * self.width)
        return np.concatenate([m.linear(f"{prefix}.{p}_proj", x, self.width) for p in "qkv"], axis=-1)

    def __call__(self, layer: int, x: np.ndarray) -> np.ndarray:
        m, prefix, t = self.model, f"model.layers.{layer}.self_attn", len(x)
        mixed = silu(causal_conv(self.projections(prefix, x), m.vector(f"{prefix}.conv1d.weight")[:, 0, :]))
        q, k, v = (mixed[:, i * self.width:(i + 1) * self.width].reshape(t, self.heads, self.dim) for i in range(3))
        f = f"{prefix}.forget_gate"
        raw = m.linear(f"{f}.f_b_proj", m.linear(f"{f}.f_a_proj", x, self.dim), self.width) + m.vector(f"{f}.dt_bias")
        g = forget_gate(raw.reshape(t, self.heads, self.dim), m.vector(f"{f}.A_log"), self.lower_bound)
        beta = sigmoid(m.linear(f"{prefix}.b_proj", x, self.heads))
        out = delta_rule(l2norm(q) * self.dim ** -0.5, l2norm(k), v, g, beta)
        gate = m.linear(f"{prefix}.g_b_proj", m.linear(f"{prefix}.g_a_proj", x, self.dim), self.width)
        gate = sigmoid(gate.reshape(t, self.heads, self.dim))
        out = m.rms_norm(out, m.vector(f"{prefix}.o_norm.weight"), self.eps) * gate
        return m.linear(f"{prefix}.o_proj", out.reshape(t, -1), m.hidden)
