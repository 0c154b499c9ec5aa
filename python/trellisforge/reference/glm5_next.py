"""A float64 numpy forward of GLM-5.3-Flash (`glm5_next`: `Glm5NextForConditionalGeneration`, text
weights under `model.language_model.*`), for tests: one prompt, all positions, no cache, as
transformers 5.17 `Glm5NextTextModel` computes it. Per layer: mHC residual streams (mhc.py) around
either Kimi delta attention (kda.py) or NoPE MLA restricted to the k-pool DSA indexer's selection
(kpool.py), then a dense MLP or the sigmoid-routed MoE, both with swiglu_limit clamps. The MTP layer
(`layers.{num_hidden_layers}`) and the vision tower are not read.

Tensor names: the peer's stored form (the checkpoint's own names: `hc_attn_fn`, `self_attn.A_log`,
`self_attn.f_a_proj`, a fused EXL3 `self_attn.qkv_proj` = [q | k | v]) and transformers' module
names (`attn_hc.fn`, `self_attn.forget_gate.*`, `q_proj`/`k_proj`/`v_proj`, fused
`experts.gate_up_proj`), conv1d fused or as q/k/v_conv1d; stored under `model.language_model.` or
`model.`. Internally every name is transformers' module name under `model.`."""
from __future__ import annotations

import json
import pathlib
import re

import numpy as np

from .. import safetensors_io
from . import glm, kpool, mhc
from .kda import KimiDeltaAttention

# Glm5NextTextConfig's defaults (transformers 5.17) for what a checkpoint's text_config leaves out.
TEXT_DEFAULTS = {
    "vocab_size": 154880, "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 2048,
    "num_hidden_layers": 45, "num_attention_heads": 64, "num_key_value_heads": 64, "n_shared_experts": 1,
    "n_routed_experts": 288, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 0, "v_head_dim": 256, "qk_nope_head_dim": 256, "n_group": 1, "topk_group": 1,
    "num_experts_per_tok": 8, "norm_topk_prob": True, "hidden_act": "silu", "max_position_embeddings": 1048576,
    "rms_norm_eps": 1e-5, "pad_token_id": 154820, "tie_word_embeddings": False, "mlp_layer_types": None,
    "attention_bias": False, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32, "head_dim": 0,
    "layer_types": None, "indexer_types": None, "swiglu_limit": 10.0, "linear_head_dim": 128,
    "linear_num_heads": 64, "linear_conv_kernel_dim": 4, "linear_lower_bound": -5.0, "hc_mult": 4,
    "hc_eps": 1e-6, "hc_sinkhorn_iters": 20, "index_kpool": 16, "index_kpool_always_select_tail": True,
}
# Keys of Glm5NextConfig itself, left out of a flat (text-only) config.
_OUTER = {"text_config", "vision_config", "image_token_id", "video_token_id", "image_start_token_id",
          "image_end_token_id", "video_start_token_id", "video_end_token_id", "architectures", "quantization_config"}


def text_config(config: dict) -> dict:
    """The merged text config, as Glm5NextTextConfig.__post_init__ fills it in."""
    raw = config.get("text_config")
    if raw is None:  # flat checkpoints keep the text fields at the top level
        raw = {k: v for k, v in config.items() if k not in _OUTER}
    c = {**TEXT_DEFAULTS, **raw}
    layers = c["num_hidden_layers"]
    if c["num_key_value_heads"] is None:
        c["num_key_value_heads"] = c["num_attention_heads"]
    if c["mlp_layer_types"] is None:  # first_k_dense_replace is ignored: three dense layers
        c["mlp_layer_types"] = ["dense"] * min(3, layers) + ["sparse"] * (layers - 3)
    if c["layer_types"] is None:
        c["layer_types"] = ["linear_attention" if i % 4 != 3 else "deepseek_sparse_attention" for i in range(layers)]
    c["layer_types"] = ["deepseek_sparse_attention" if t == "full_attention" else t for t in c["layer_types"]]
    if c["indexer_types"] is None:
        pattern = c.get("index_topk_pattern")
        if pattern is not None:
            c["indexer_types"] = ([{"F": "full", "S": "shared"}[p] for p in pattern] if isinstance(pattern, str)
                                  else list(pattern))
        else:
            freq, offset = max(c.get("index_topk_freq", 1), 1), c.get("index_skip_topk_offset", 2)
            c["indexer_types"] = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
    linear = c.get("linear_attn_config")
    if linear is not None:
        c["linear_head_dim"] = linear.get("head_dim", c["linear_head_dim"])
        c["linear_num_heads"] = linear.get("num_heads", c["linear_num_heads"])
        c["linear_conv_kernel_dim"] = linear.get("short_conv_kernel_size", c["linear_conv_kernel_dim"])
        c["linear_lower_bound"] = linear.get("gate_lower_bound", c["linear_lower_bound"])
        # A null gate_lower_bound is still -5.0 unless safe_gate is false: the softplus path needs both.
        if linear.get("safe_gate", True) and c["linear_lower_bound"] is None:
            c["linear_lower_bound"] = -5.0
    c["head_dim"] = c["qk_rope_head_dim"]
    c["qk_head_dim"] = c["qk_rope_head_dim"] + c["qk_nope_head_dim"]
    if c["num_attention_heads"] != c["num_key_value_heads"]:
        raise ValueError("num_attention_heads must equal num_key_value_heads")
    if c["index_kpool"] < 1 or c["index_topk"] % c["index_kpool"]:
        raise ValueError(f"index_topk {c['index_topk']} must be a multiple of index_kpool {c['index_kpool']} >= 1")
    if c["q_lora_rank"] is None:
        raise ValueError("glm5_next requires q_lora_rank")
    if c["qk_rope_head_dim"]:
        raise NotImplementedError("glm5_next attention is NoPE: qk_rope_head_dim must be 0")
    return c


# The checkpoint's own names -> transformers' module names (conversion_mapping.py "glm5_next").
_RENAMES = [(re.compile(p), r) for p, r in [
    (r"\.self_attn\.(f_a_proj|f_b_proj|dt_bias|A_log)\b", r".self_attn.forget_gate.\1"),
    (r"\.hc_(attn|ffn)_(fn|base|scale)$", r".\1_hc.\2"),
]]


def canonical_tensors(tensors: dict, dtypes: dict, layers: int) -> tuple[dict, dict]:
    """Renames to `model.layers.N.<transformers module name>`; drops vision and MTP tensors;
    concatenates q/k/v_conv1d and splits fused experts."""
    out, types = {}, {}
    for name, value in tensors.items():
        key = name
        for prefix in ("model.language_model.", "language_model.model.", "language_model."):
            if key.startswith(prefix):
                key = "model." + key[len(prefix):]
                break
        if key.startswith(("model.visual.", "visual.")):
            continue
        layer = re.match(r"model\.layers\.(\d+)\.", key)
        if layer and int(layer.group(1)) >= layers:
            continue  # the MTP layer
        for pattern, replacement in _RENAMES:
            key = pattern.sub(replacement, key)
        out[key], types[key] = value, dtypes[name]
    for key in [k for k in out if k.endswith(".self_attn.q_conv1d.weight")]:
        base = key[:-len("q_conv1d.weight")]
        parts = [f"{base}{p}_conv1d.weight" for p in "qkv"]
        out[f"{base}conv1d.weight"] = np.concatenate([out.pop(p) for p in parts])
        types[f"{base}conv1d.weight"] = types[parts[0]]
    for key in [k for k in out if k.endswith(".mlp.experts.gate_up_proj")]:
        base = key[:-len("gate_up_proj")]
        gate_up, down = out.pop(key), out.pop(f"{base}down_proj")
        half = gate_up.shape[1] // 2
        for e in range(gate_up.shape[0]):
            for proj, value in (("gate_proj", gate_up[e, :half]), ("up_proj", gate_up[e, half:]),
                                ("down_proj", down[e])):
                out[f"{base}{e}.{proj}.weight"], types[f"{base}{e}.{proj}.weight"] = value, types[key]
    return out, types


class PooledSparseAttention:
    """NoPE MLA over the tokens of the k-pool indexer's selection; one forward's worth. A "full"
    layer runs its indexer; a "shared" one reuses the selection handed over by the layer just before
    it, which transformers passes on only from a full DSA layer whose next layer is shared."""

    def __init__(self, model):
        c = model.config
        self.model = model
        self.heads, self.kv_lora_rank = c["num_attention_heads"], c["kv_lora_rank"]
        self.q_lora_rank, self.nope, self.v_dim = c["q_lora_rank"], c["qk_nope_head_dim"], c["v_head_dim"]
        self.scale = c["qk_head_dim"] ** -0.5
        self.eps = c["rms_norm_eps"]  # q_a/kv_a_layernorm use rms_norm_eps here (glm_moe_dsa: 1e-6)
        self.types = c["indexer_types"]
        self.kpool, self.tail = c["index_kpool"], c["index_kpool_always_select_tail"]
        self.pool_top_k = c["index_topk"] // self.kpool
        self.index_heads, self.index_dim = c["index_n_heads"], c["index_head_dim"]
        self.scores: dict[int, np.ndarray] = {}

    def indexer(self, layer: int, x: np.ndarray, q_latent: np.ndarray) -> np.ndarray:
        m, p, t = self.model, f"model.layers.{layer}.self_attn.indexer", len(x)
        q = m.linear(f"{p}.wq_b", q_latent, self.index_heads * self.index_dim).reshape(t, self.index_heads, -1)
        k = kpool.layer_norm(m.linear(f"{p}.wk", x, self.index_dim), m.vector(f"{p}.k_norm.weight"),
                             m.vector(f"{p}.k_norm.bias"))
        gate = x @ m.vector(f"{p}.index_kpool_compress_gate").T
        keys = kpool.pool_keys(k, gate, m.vector(f"{p}.index_kpool_compress_ape"))
        weights = m.linear(f"{p}.weights_proj", x, self.index_heads) * self.index_heads ** -0.5
        return kpool.scores(q, keys, weights, t, self.kpool)

    def __call__(self, layer: int, x: np.ndarray, handed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
        """(output [T, hidden], the [T, T] visible-token mask handed to the next layer or None)."""
        m, prefix, t = self.model, f"model.layers.{layer}.self_attn", len(x)
        q_latent = m.rms_norm(m.linear(f"{prefix}.q_a_proj", x, self.q_lora_rank),
                              m.vector(f"{prefix}.q_a_layernorm.weight"), self.eps)
        q = m.linear(f"{prefix}.q_b_proj", q_latent, self.heads * self.nope).reshape(t, self.heads, -1)
        latent = m.rms_norm(m.linear(f"{prefix}.kv_a_proj_with_mqa", x, self.kv_lora_rank),
                            m.vector(f"{prefix}.kv_a_layernorm.weight"), self.eps)
        kv = m.linear(f"{prefix}.kv_b_proj", latent, self.heads * (self.nope + self.v_dim)).reshape(t, self.heads, -1)
        k, v = kv[..., :self.nope], kv[..., self.nope:]
        if self.types[layer] == "shared":
            if handed is None:
                raise ValueError(f"layer {layer} shares the indexer selection but layer {layer - 1} is no full "
                                 "DSA layer: transformers hands a selection on only to the very next layer")
            visible = handed
        else:
            self.scores[layer] = self.indexer(layer, x, q_latent)
            pools = kpool.select(self.scores[layer], self.pool_top_k, m.tie_breaks.get(layer))
            visible = kpool.visible_tokens(pools, t, self.kpool, self.tail)
        out = np.zeros((t, self.heads, self.v_dim))
        empty = ~visible.any(-1)
        for h in range(self.heads):
            s = np.where(visible, q[:, h] @ k[:, h].T * self.scale, -np.inf)
            s[empty] = 0.0
            p = np.exp(s - s.max(-1, keepdims=True))
            out[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, h]
        # A query that selects nothing (possible without the tail): transformers' SDPA path outputs 0,
        # its eager path adds finfo.min to every score and so averages all T values, future included.
        if m.empty_rows == "zero":
            out[empty] = 0.0
        nxt = self.types[min(layer + 1, len(self.types) - 1)]
        hand_on = self.types[layer] != "shared" and nxt == "shared"
        return m.linear(f"{prefix}.o_proj", out.reshape(t, -1), m.hidden), (visible if hand_on else None)


class Model(glm.Model):
    """glm.Model's interface: `config` (the merged text config), `forward(tokens) -> (logits
    [T, vocab], routing)`, then `indexer_scores` {layer: [T, n_pools]} (-inf where a pool is not
    selectable); `tie_breaks` {layer: {query: [pools]}} picks among exactly tied pools;
    `pool_top_k` pools per query. empty_rows: "zero" (transformers SDPA, the default) or "uniform"
    (eager) for a query whose selection is empty."""

    def __init__(self, model_dir: str | pathlib.Path, empty_rows: str = "zero"):
        model_dir = pathlib.Path(model_dir)
        raw = json.loads((model_dir / "config.json").read_text())
        if raw.get("model_type") not in ("glm5_next", "glm5_next_text"):
            raise NotImplementedError(f"model_type {raw.get('model_type')!r}")
        self.model_type = "glm5_next"
        self.config = c = text_config(raw)
        header, _ = safetensors_io.read_header(model_dir / "model.safetensors")
        dtypes = {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}
        self.tensors, self.dtypes = canonical_tensors(safetensors_io.load(model_dir / "model.safetensors"), dtypes,
                                                      c["num_hidden_layers"])
        self.hidden = c["hidden_size"]
        self.eps = c["rms_norm_eps"]
        self.mlp_types = c["mlp_layer_types"]
        self.dropped_group_score = -np.inf
        self.empty_rows = empty_rows
        self.pool_top_k = c["index_topk"] // c["index_kpool"]
        self.indexer_scores: dict[int, np.ndarray] = {}
        self.tie_breaks: dict[int, dict[int, list[int]]] = {}
        self._cache: dict[str, np.ndarray] = {}

    def has_linear(self, prefix: str) -> bool:
        return f"{prefix}.trellis" in self.tensors or f"{prefix}.weight" in self.tensors

    def mlp(self, prefix: str, x: np.ndarray, intermediate: int) -> np.ndarray:
        """SwiGLU with transformers' clamps: the gate from above only, up on both sides."""
        gate = self.linear(f"{prefix}.gate_proj", x, intermediate)
        up = self.linear(f"{prefix}.up_proj", x, intermediate)
        limit = self.config["swiglu_limit"]
        if limit is not None:
            gate, up = np.minimum(gate, limit), np.clip(up, -limit, limit)
        return self.linear(f"{prefix}.down_proj", gate / (1 + np.exp(-gate)) * up, self.hidden)

    def hyper(self, name: str, streams: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        c = self.config
        return mhc.mappings(streams, self.vector(f"{name}.fn"), self.vector(f"{name}.base"),
                            self.vector(f"{name}.scale"), c["hc_sinkhorn_iters"], c["hc_eps"], c["rms_norm_eps"])

    def selection_margins(self, layer: int) -> np.ndarray:
        """Per query of the last forward, how far layer's pool top-k is from flipping (0: exact tie)."""
        return kpool.selection_margins(self.indexer_scores[layer], self.pool_top_k)

    def first_near_tie(self, margin: float = 0.0) -> int | None:
        """The first query whose pool selection, in any layer, is within `margin` of flipping."""
        starts = [int(q[0]) for q in (np.flatnonzero(self.selection_margins(layer) <= margin)
                                      for layer in self.indexer_scores) if q.size]
        return min(starts) if starts else None

    def forward(self, tokens: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
        """Logits (T, vocab) and, per MoE layer, each position's selection scores sorted descending.
        Afterwards `indexer_scores` maps each full DSA layer to its [T, n_pools] pool scores."""
        c = self.config
        kda, attention = KimiDeltaAttention(self), PooledSparseAttention(self)
        streams = np.repeat(self.vector("model.embed_tokens.weight")[tokens][:, None, :], c["hc_mult"], axis=1)
        routing: list[np.ndarray] = []
        handed = None
        for layer in range(c["num_hidden_layers"]):
            p = f"model.layers.{layer}"
            pre, post, comb = self.hyper(f"{p}.attn_hc", streams)
            x = self.rms_norm(mhc.collapse(pre, streams), self.vector(f"{p}.input_layernorm.weight"))
            if c["layer_types"][layer] == "linear_attention":
                out, handed = kda(layer, x), None
            else:
                out, handed = attention(layer, x, handed)
            streams = mhc.expand(post, comb, out, streams)
            pre, post, comb = self.hyper(f"{p}.ffn_hc", streams)
            x = self.rms_norm(mhc.collapse(pre, streams), self.vector(f"{p}.post_attention_layernorm.weight"))
            if self.mlp_types[layer] == "dense":
                out = self.mlp(f"{p}.mlp", x, c["intermediate_size"])
            else:
                out = self.moe(f"{p}.mlp", x, routing)
            streams = mhc.expand(post, comb, out, streams)
        self.indexer_scores = attention.scores
        h = self.rms_norm(mhc.head(streams), self.vector("model.norm.weight"))
        return self.linear("lm_head", h, c["vocab_size"]), routing
