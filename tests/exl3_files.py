"""Writes EXL3 layers with random trellis words into safetensors files, for the tests."""
from __future__ import annotations

import numpy as np

from trellisforge import safetensors_io

MARKERS = {"mul1": np.int32(-2082680531), "mcg": np.int32(-877912083)}


def random_layer(rng: np.random.Generator, prefix: str, rows: int, columns: int, bits: float,
                 codebook: str, bias: bool = True) -> dict[str, np.ndarray]:
    words = int(16 * bits)  # 16 K, or 16 KA + 8 for K = KA + 1/2
    tensors = {
        f"{prefix}.trellis": rng.integers(-32768, 32768, size=(rows // 16, columns // 16, words), dtype=np.int16),
        f"{prefix}.suh": (rng.standard_normal(rows) * 0.5).astype(np.float16),
        f"{prefix}.svh": (rng.standard_normal(columns) * 0.05).astype(np.float16),
    }
    if codebook in MARKERS:
        tensors[f"{prefix}.{codebook}"] = np.array(MARKERS[codebook], dtype=np.int32)
    if bias:
        tensors[f"{prefix}.bias"] = (rng.standard_normal(columns) * 0.1).astype(np.float16)
    return tensors


def write(path, tensors: dict[str, np.ndarray]) -> None:
    safetensors_io.save(path, tensors)
