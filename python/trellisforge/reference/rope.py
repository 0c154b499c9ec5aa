"""Rotary position embedding for the references: the frequencies (plain, YaRN, linear, llama3 or
proportional, as transformers 5.17 `modeling_rope_utils` computes them) and the two pairings,
rotate-half (NeoX) and interleaved (GPT-J). GLM.md §3.4."""
from __future__ import annotations

import math

import numpy as np


def parameters(config: dict) -> dict:
    """The rope dict transformers ends up with: a legacy `rope_scaling` replaces `rope_parameters`,
    `rope_theta` falls back to the top level, then to 10000."""
    params = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    params.setdefault("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", config.get("rope_theta") or 10000.0)
    if config.get("partial_rotary_factor") is not None:
        params.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    return params


def get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rotated_dims(config: dict, dim: int, head_dim: int) -> int:
    """The dims cos and sin cover: `dim`, or the whole head for "proportional" (whose pairs past
    its partial_rotary_factor turn with frequency 0)."""
    return head_dim if parameters(config)["rope_type"] == "proportional" else dim


def frequencies(config: dict, dim: int) -> tuple[np.ndarray, float]:
    """(inv_freq [dim/2], factor on cos and sin) for `dim` rotated dimensions (for "proportional",
    `dim` is the whole head: rotated_dims)."""
    p = parameters(config)
    base = p["rope_theta"]
    exponents = np.arange(0, dim, 2) / dim
    kind = p["rope_type"]
    if kind == "default":
        return base ** -exponents, 1.0
    if kind == "linear":
        return base ** -exponents / p["factor"], 1.0
    if kind == "proportional":
        turning = int(p.get("partial_rotary_factor", 1.0) * dim // 2)
        inv_freq = np.where(np.arange(dim // 2) < turning, base ** -exponents, 0.0)
        return inv_freq / p.get("factor", 1.0), 1.0
    if kind == "llama3":
        inv_freq = base ** -exponents
        old = p["original_max_position_embeddings"]
        low, high = p["low_freq_factor"], p["high_freq_factor"]
        wavelength = 2 * math.pi / inv_freq
        smooth = (old / wavelength - low) / (high - low)
        blended = (1 - smooth) * inv_freq / p["factor"] + smooth * inv_freq
        return np.where(wavelength > old / low, inv_freq / p["factor"],
                        np.where(wavelength < old / high, inv_freq, blended)), 1.0
    if kind != "yarn":
        raise NotImplementedError(f"rope_type {kind!r}")
    # A top-level original_max_position_embeddings overrides the dict's (transformers' Phi-3 rule).
    original = config.get("original_max_position_embeddings") or p.get("original_max_position_embeddings") \
        or config["max_position_embeddings"]
    factor = p.get("factor") or config["max_position_embeddings"] / original
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    extrapolation = base ** -exponents
    return extrapolation / factor * ramp + extrapolation * (1 - ramp), attention_factor


def softmax_scale(config: dict, head_dim: int) -> float:
    """head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 for any non-default rope type that
    sets mscale_all_dim (transformers `yarn_apply_mscale`, the DeepSeek-V3 rule)."""
    p = parameters(config)
    scale = head_dim ** -0.5
    if p["rope_type"] != "default" and p.get("mscale_all_dim"):
        scale *= get_mscale(p["factor"], p["mscale_all_dim"]) ** 2
    return scale


def rotate(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, interleaved: bool,
           attention_factor: float = 1.0) -> np.ndarray:
    """Rotates all of x's last dimension; x is [T, heads, dim], positions [T]. Interleaved pairs
    (2j, 2j+1) stay in place (transformers moves them to [evens | odds] in q and k alike, which
    leaves every q·k unchanged)."""
    angle = positions[:, None] * inv_freq[None, :]
    cos = (np.cos(angle) * attention_factor)[:, None, :]
    sin = (np.sin(angle) * attention_factor)[:, None, :]
    out = np.empty_like(x)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
    else:
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        out[..., :half], out[..., half:] = a * cos - b * sin, b * cos + a * sin
    return out
