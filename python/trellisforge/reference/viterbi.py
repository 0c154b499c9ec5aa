"""The Viterbi tile encoder of shared/EXL3.md §11.5 in plain numpy fp16 arithmetic, written from the
spec for the tests (independent of zig/src/exl3/encode.zig). About a second per tile."""
from __future__ import annotations

import numpy as np

from .exl3 import decode_states

F16_INF = np.float16(np.inf)


def _rank(e: np.ndarray) -> np.ndarray:
    def bitrev5(x):
        out = np.zeros_like(x)
        for b in range(5):
            out |= ((x >> b) & 1) << (4 - b)
        return out
    v = e & 1023
    return (bitrev5(v >> 5) << 10) | (bitrev5(v & 31) << 5) | (e >> 10)


def _forward(x16, codes, bits, roll, pre):
    edges = 1 << (16 - bits)
    states = np.arange(1 << 16)
    from_state = states >> bits
    back = np.empty((256, edges), dtype=np.int64)
    prev = None
    for i in range(256):
        position = (i + roll) & 255
        d = (codes.astype(np.float64) - np.float64(x16[position])).astype(np.float16)  # hsub
        if i == 0:
            cost = (d.astype(np.float64) ** 2).astype(np.float16)  # hmul
            if pre is not None:
                cost = np.where(from_state == pre, cost, F16_INF)
        else:
            cost = (d.astype(np.float64) ** 2 + prev[from_state].astype(np.float64)).astype(np.float16)  # hfma
        by_branch = cost.reshape(1 << bits, edges)  # s = (k << (16 - K)) | o
        k = np.argmin(by_branch, axis=0)  # the first (lowest) k among equal minima
        prev = by_branch[k, np.arange(edges)]
        back[position] = ((k << (16 - bits)) | np.arange(edges)) >> bits
    return prev, back


def encode_tile(values: np.ndarray, bits: int, codebook: str) -> np.ndarray:
    """256 values in trellis order -> 256 states (uint16)."""
    x16 = np.asarray(values, dtype=np.float32).astype(np.float16)
    codes = decode_states(np.arange(1 << 16), codebook)
    prev, back = _forward(x16, codes, bits, 128, None)
    best = prev.min()
    candidates = np.flatnonzero(prev == best)
    o = int(candidates[np.argmin(_rank(candidates))])
    for position in range(127, -1, -1):
        o = int(back[position, o])
    end = o
    _, back = _forward(x16, codes, bits, 0, end)
    states = np.empty(256, dtype=np.int64)
    o = end
    for position in range(255, -1, -1):
        b = int(back[position, o])
        states[position] = ((b << bits) | o) & 0xFFFF
        o = b
    return states.astype(np.uint16)
