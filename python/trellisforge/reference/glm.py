"""A float64 numpy forward of the GLM class-A model (GLM.md §3), from the document, for tests:
one prompt, all positions, no cache. EXL3 linears are reconstructed by `reference.exl3` (also
independent of the library). Records each MoE layer's routing scores so that a test can tell a
near-tie routing flip from a real error."""
from __future__ import annotations

import json
import pathlib

import numpy as np

from .. import safetensors_io
from . import exl3


class Model:
    def __init__(self, model_dir: str | pathlib.Path):
        model_dir = pathlib.Path(model_dir)
        self.config = json.loads((model_dir / "config.json").read_text())
        header, _ = safetensors_io.read_header(model_dir / "model.safetensors")
        self.dtypes = {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}
        self.tensors = safetensors_io.load(model_dir / "model.safetensors")
        c = self.config
        rope = c.get("rope_parameters") or {}
        self.hidden = c["hidden_size"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads", self.heads)
        self.head_dim = c.get("head_dim") or self.hidden // self.heads
        self.rotary_dim = int(self.head_dim * c.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.5)))
        self.theta = c.get("rope_theta", rope.get("rope_theta", 10000.0))
        self.eps = c.get("rms_norm_eps", 1e-5)
        self._cache: dict[str, np.ndarray] = {}

    def vector(self, name: str) -> np.ndarray:
        value = self.tensors[name]
        if self.dtypes[name] == "BF16":
            return safetensors_io.bf16_to_float32(value).astype(np.float64)
        return value.astype(np.float64)

    def weight(self, prefix: str) -> tuple[np.ndarray, np.ndarray | None]:
        """(W in y = x @ W orientation, bias) in float64."""
        if prefix not in self._cache:
            if f"{prefix}.trellis" in self.tensors:
                codebook = "mul1" if f"{prefix}.mul1" in self.tensors else "mcg" if f"{prefix}.mcg" in self.tensors else "3inst"
                inner = exl3.decode_trellis(self.tensors[f"{prefix}.trellis"], codebook)
                w = exl3.weight(inner, self.tensors[f"{prefix}.suh"], self.tensors[f"{prefix}.svh"])
            elif prefix == "lm_head" and "lm_head.weight" not in self.tensors:
                w = self.vector("model.embed_tokens.weight").T  # tied embeddings
            else:
                w = self.vector(f"{prefix}.weight").T
            self._cache[prefix] = w
        bias = f"{prefix}.bias"
        return self._cache[prefix], (self.vector(bias) if bias in self.tensors else None)

    def linear(self, prefix: str, x: np.ndarray, out_features: int) -> np.ndarray:
        w, bias = self.weight(prefix)
        return exl3.linear(x, w, bias)[:, :out_features]

    def rms_norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return weight * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)

    def rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        half = self.rotary_dim // 2
        inv_freq = self.theta ** (-np.arange(half) * 2.0 / self.rotary_dim)
        angle = positions[:, None] * inv_freq[None, :]
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        out = x.copy()
        a, b = x[..., :half], x[..., half:self.rotary_dim]
        out[..., :half] = a * cos - b * sin
        out[..., half:self.rotary_dim] = b * cos + a * sin
        return out

    def mlp(self, prefix: str, x: np.ndarray, intermediate: int) -> np.ndarray:
        gate = self.linear(f"{prefix}.gate_proj", x, intermediate)
        up = self.linear(f"{prefix}.up_proj", x, intermediate)
        return self.linear(f"{prefix}.down_proj", gate / (1 + np.exp(-gate)) * up, self.hidden)

    def moe(self, prefix: str, x: np.ndarray, routing: list) -> np.ndarray:
        c = self.config
        experts, k = c["n_routed_experts"], c["num_experts_per_tok"]
        scores = 1 / (1 + np.exp(-(x @ self.vector(f"{prefix}.gate.weight").T)))
        choice = scores + self.vector(f"{prefix}.gate.e_score_correction_bias")
        groups = c.get("n_group", 1)
        if groups > 1:
            grouped = choice.reshape(len(x), groups, -1)
            group_score = np.sort(grouped, axis=-1)[..., -2:].sum(-1)
            keep = np.argsort(-group_score, axis=-1, kind="stable")[:, : c.get("topk_group", 1)]
            mask = np.zeros_like(group_score, dtype=bool)
            np.put_along_axis(mask, keep, True, axis=-1)
            choice = np.where(np.repeat(mask, experts // groups, axis=-1), choice, 0.0)
        routing.append(np.sort(choice, axis=-1)[:, ::-1])
        selected = np.argsort(-choice, axis=-1, kind="stable")[:, :k]
        out = np.zeros_like(x)
        intermediate = c["moe_intermediate_size"]
        for row in range(len(x)):
            weights = scores[row, selected[row]]
            if c.get("norm_topk_prob", True):
                weights = weights / (weights.sum() + 1e-20)
            weights = weights * c.get("routed_scaling_factor", 1.0)
            for e, w in sorted(zip(selected[row], weights)):
                out[row] += w * self.mlp(f"{prefix}.experts.{e}", x[row:row + 1], intermediate)[0]
        if c.get("n_shared_experts", 1):
            out += self.mlp(f"{prefix}.shared_experts", x, intermediate * c.get("n_shared_experts", 1))
        return out

    def attention(self, prefix: str, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        t, d = len(x), self.head_dim
        q = self.linear(f"{prefix}.q_proj", x, self.heads * d).reshape(t, self.heads, d)
        k = self.linear(f"{prefix}.k_proj", x, self.kv_heads * d).reshape(t, self.kv_heads, d)
        v = self.linear(f"{prefix}.v_proj", x, self.kv_heads * d).reshape(t, self.kv_heads, d)
        if self.config.get("use_qk_norm"):
            q = self.rms_norm(q, self.vector(f"{prefix}.q_norm.weight"))
            k = self.rms_norm(k, self.vector(f"{prefix}.k_norm.weight"))
        q, k = self.rope(q, positions), self.rope(k, positions)
        group = self.heads // self.kv_heads
        out = np.empty((t, self.heads, d))
        causal = np.triu(np.full((t, t), -np.inf), 1)
        for h in range(self.heads):
            scores = q[:, h] @ k[:, h // group].T / np.sqrt(d) + causal
            p = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, h // group]
        return self.linear(f"{prefix}.o_proj", out.reshape(t, -1), self.hidden)

    def forward(self, tokens: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
        """Logits (T, vocab) and, per MoE layer, each position's selection scores sorted descending."""
        c = self.config
        positions = np.arange(len(tokens), dtype=np.float64)
        h = self.vector("model.embed_tokens.weight")[tokens]
        routing: list[np.ndarray] = []
        for layer in range(c["num_hidden_layers"]):
            p = f"model.layers.{layer}"
            h = h + self.attention(f"{p}.self_attn", self.rms_norm(h, self.vector(f"{p}.input_layernorm.weight")), positions)
            m = self.rms_norm(h, self.vector(f"{p}.post_attention_layernorm.weight"))
            if layer < c.get("first_k_dense_replace", 1):
                h = h + self.mlp(f"{p}.mlp", m, c["intermediate_size"])
            else:
                h = h + self.moe(f"{p}.mlp", m, routing)
        h = self.rms_norm(h, self.vector("model.norm.weight"))
        return self.linear("lm_head", h, c["vocab_size"]), routing
