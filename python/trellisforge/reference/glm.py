"""A float64 numpy forward of the GLM MoE classes (GLM.md §3), for tests: one prompt, all
positions, no cache. Class A (`glm4_moe`) from the document; classes B (`glm4_moe_lite`) and C
(`glm_moe_dsa`) as transformers 5.17 computes them, which is the truth where the two differ. EXL3
linears are reconstructed by `reference.exl3` (also independent of the library). Records each MoE
layer's routing scores, and each DSA layer's indexer scores, so that a test can tell a near-tie
flip from a real error."""
from __future__ import annotations

import json
import pathlib

import numpy as np

from .. import safetensors_io
from . import exl3
from .dsa import SparseLatentAttention
from .gqa import GroupedQueryAttention
from .mla import MultiHeadLatentAttention

ATTENTION = {"glm4_moe": GroupedQueryAttention, "glm4_moe_lite": MultiHeadLatentAttention,
             "glm_moe_dsa": SparseLatentAttention}

# The transformers config classes' defaults for what a B/C checkpoint may leave out.
_MLA_DEFAULTS = {
    "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
    "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "rms_norm_eps": 1e-5,
}
DEFAULTS = {
    "glm4_moe": {},
    "glm4_moe_lite": {**_MLA_DEFAULTS, "q_lora_rank": 768, "n_routed_experts": 64, "num_experts_per_tok": 4,
                      "routed_scaling_factor": 1.8, "intermediate_size": 10240, "moe_intermediate_size": 1536,
                      "rope_interleave": True},
    "glm_moe_dsa": {**_MLA_DEFAULTS, "q_lora_rank": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8,
                    "routed_scaling_factor": 2.5, "intermediate_size": 12288, "moe_intermediate_size": 2048,
                    "first_k_dense_replace": 3, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32},
}


def mlp_layer_types(config: dict) -> list[str]:
    """"dense" or "sparse" per layer. Class B's transformers config ignores first_k_dense_replace:
    without mlp_layer_types only layer 0 is dense."""
    layers = config["num_hidden_layers"]
    if config.get("model_type", "glm4_moe") != "glm4_moe" and config.get("mlp_layer_types") is not None:
        return list(config["mlp_layer_types"])
    dense = 1 if config.get("model_type") == "glm4_moe_lite" else config.get("first_k_dense_replace", 1)
    return ["dense" if layer < dense else "sparse" for layer in range(layers)]


class Model:
    def __init__(self, model_dir: str | pathlib.Path):
        model_dir = pathlib.Path(model_dir)
        config = json.loads((model_dir / "config.json").read_text())
        self.model_type = config.get("model_type", "glm4_moe")
        if self.model_type not in ATTENTION:
            raise NotImplementedError(f"model_type {self.model_type!r}")
        self.config = c = {**DEFAULTS[self.model_type], **config}
        header, _ = safetensors_io.read_header(model_dir / "model.safetensors")
        self.dtypes = {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}
        self.tensors = safetensors_io.load(model_dir / "model.safetensors")
        self.hidden = c["hidden_size"]
        self.eps = c.get("rms_norm_eps", 1e-5)
        self.mlp_types = mlp_layer_types(c)
        # transformers masks the experts of dropped groups with -inf, in every class (GLM.md §3.8
        # says 0, which differs when a kept selection score is negative): the reference wins.
        self.dropped_group_score = -np.inf
        self.indexer_scores: dict[int, np.ndarray] = {}
        # {layer: {query: tied keys to take}}: another implementation's choice among exact ties.
        self.tie_breaks: dict[int, dict[int, list[int]]] = {}
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

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float | None = None) -> np.ndarray:
        return weight * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + (self.eps if eps is None else eps))

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
            choice = np.where(np.repeat(mask, experts // groups, axis=-1), choice, self.dropped_group_score)
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

    def forward(self, tokens: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
        """Logits (T, vocab) and, per MoE layer, each position's selection scores sorted descending.
        Afterwards `indexer_scores` maps each DSA layer that ran its indexer to its [T, T] scores
        (-inf above the diagonal)."""
        c = self.config
        positions = np.arange(len(tokens), dtype=np.float64)
        attention = ATTENTION[self.model_type](self)  # per forward: DSA keeps its selection across layers
        h = self.vector("model.embed_tokens.weight")[tokens]
        routing: list[np.ndarray] = []
        for layer in range(c["num_hidden_layers"]):
            p = f"model.layers.{layer}"
            h = h + attention(layer, self.rms_norm(h, self.vector(f"{p}.input_layernorm.weight")), positions)
            m = self.rms_norm(h, self.vector(f"{p}.post_attention_layernorm.weight"))
            if self.mlp_types[layer] == "dense":
                h = h + self.mlp(f"{p}.mlp", m, c["intermediate_size"])
            else:
                h = h + self.moe(f"{p}.mlp", m, routing)
        self.indexer_scores = getattr(attention, "scores", {})
        h = self.rms_norm(h, self.vector("model.norm.weight"))
        return self.linear("lm_head", h, c["vocab_size"]), routing
