"""EXL3 decode and linear in float64 numpy, straight from shared/EXL3.md (§4-§9).

Deliberately written bit by bit from the spec's definitions (stream bits, cyclic windows, the
PERM table), not from the library's word-level shortcuts."""
from __future__ import annotations

import numpy as np

MUL1_SCALE = np.float16(np.uint16(0x1EEE).view(np.float16))
MUL1_BIAS = np.float16(np.uint16(0xC931).view(np.float16))
CODEBOOKS = ("3inst", "mcg", "mul1")


def tile_perm() -> np.ndarray:
    """PERM[i] = 16 r + c for position i = 8 t + e (EXL3.md §4 table)."""
    perm = np.empty(256, dtype=np.int64)
    for i in range(256):
        t, e = divmod(i, 8)
        r = 2 * (t % 4) + [0, 1, 8, 9, 0, 1, 8, 9][e]
        c = t // 4 + (8 if e >= 4 else 0)
        perm[i] = 16 * r + c
    return perm


def symbol_widths(bits: float) -> np.ndarray:
    """Bits of each of the 256 positions: K, or for K = KA + 1/2, KA + 1 at odd positions (§7)."""
    if float(bits).is_integer():
        return np.full(256, int(bits), dtype=np.int64)
    low = int(bits)
    return np.array([low + ((0xAAAA >> (i % 16)) & 1) for i in range(256)], dtype=np.int64)


def tile_states(words: np.ndarray, bits: float) -> np.ndarray:
    """States of every tile from stored int16 elements (..., words) -> (..., 256) (§5).

    Bit level, as the spec defines it: element pair (2w, 2w+1) is a little-endian uint32 whose MSB
    is the earliest stream bit; position i's state is the 16 stream bits ending at its end bit,
    read cyclically."""
    elements = np.asarray(words).astype(np.uint16)
    lead = elements.shape[:-1]
    pairs = elements.reshape(-1, elements.shape[-1] // 2, 2).astype(np.uint32)
    stream_words = pairs[..., 0] | (pairs[..., 1] << 16)
    shifts = np.arange(31, -1, -1, dtype=np.uint32)
    stream = ((stream_words[..., None] >> shifts) & 1).reshape(pairs.shape[0], -1).astype(np.int64)
    total = stream.shape[1]
    ends = np.cumsum(symbol_widths(bits))
    assert ends[-1] == total, "ring size must equal the tile's bits"
    window = (ends[:, None] - 16 + np.arange(16)[None, :]) % total  # (256, 16), earliest first
    weights = 1 << np.arange(15, -1, -1, dtype=np.int64)
    states = stream[:, window] @ weights
    return states.reshape(*lead, 256)


def decode_states(states: np.ndarray, codebook: str) -> np.ndarray:
    """fp16 weight of each state (§6.2), with the format's single rounding."""
    s = np.asarray(states, dtype=np.uint64)
    if codebook == "mul1":
        x = (s * np.uint64(0x83DCD12D)) & np.uint64(0xFFFFFFFF)
        byte_sum = sum(((x >> np.uint64(8 * b)) & np.uint64(0xFF)) for b in range(4))
        h = (1024 + byte_sum).astype(np.float64)
        return (h * np.float64(MUL1_SCALE) + np.float64(MUL1_BIAS)).astype(np.float16)
    if codebook == "3inst":
        x = (s * np.uint64(0x05517C72) + np.uint64(0x03D45AA4)) & np.uint64(0xFFFFFFFF)
    elif codebook == "mcg":
        x = (s * np.uint64(0xCBAC1FED)) & np.uint64(0xFFFFFFFF)
    else:
        raise ValueError(codebook)
    x = (x & np.uint64(0x8FFF8FFF)) ^ np.uint64(0x3B603B60)
    low = (x & np.uint64(0xFFFF)).astype(np.uint16).view(np.float16)
    high = (x >> np.uint64(16)).astype(np.uint16).view(np.float16)
    return (low.astype(np.float64) + high.astype(np.float64)).astype(np.float16)


def decode_trellis(trellis: np.ndarray, codebook: str) -> np.ndarray:
    """Wq (k_p, n_p) float16 from trellis (k_p/16, n_p/16, words) (§9 steps 1-3)."""
    tiles_k, tiles_n, words = trellis.shape
    bits = words / 16
    perm = tile_perm()
    values = decode_states(tile_states(trellis, bits), codebook)  # (tiles_k, tiles_n, 256)
    tiles = np.empty_like(values)
    tiles[..., perm] = values
    tiles = tiles.reshape(tiles_k, tiles_n, 16, 16)
    return tiles.transpose(0, 2, 1, 3).reshape(tiles_k * 16, tiles_n * 16)


def hadamard_128() -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < 128:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(128.0)


def block_hadamard(size: int) -> np.ndarray:
    assert size % 128 == 0
    return np.kron(np.eye(size // 128), hadamard_128())


def weight(inner: np.ndarray, suh: np.ndarray, svh: np.ndarray) -> np.ndarray:
    """W = diag(suh) Hk Wq Hn diag(svh) in float64 (§8.2)."""
    k, n = inner.shape
    w = block_hadamard(k) @ inner.astype(np.float64) @ block_hadamard(n)
    return suh.astype(np.float64)[:, None] * w * svh.astype(np.float64)[None, :]


def linear(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """y = x_padded @ W + bias (§9 step 5), float64."""
    x = np.asarray(x, dtype=np.float64)
    padded = np.zeros((x.shape[0], w.shape[0]))
    padded[:, :x.shape[1]] = x
    y = padded @ w
    if bias is not None:
        y = y + bias.astype(np.float64)[None, : y.shape[1]]
    return y


def pack_symbols(symbols: np.ndarray, bits: float) -> np.ndarray:
    """Inverse of the stream layout (§5, §11.6): symbols in position order -> stored int16 elements."""
    widths = symbol_widths(bits)
    stream = []
    for symbol, width in zip(np.asarray(symbols).tolist(), widths.tolist()):
        stream.extend((symbol >> (width - 1 - b)) & 1 for b in range(width))
    stream_words = [int("".join(map(str, stream[j:j + 32])), 2) for j in range(0, len(stream), 32)]
    elements = []
    for word in stream_words:
        elements += [word & 0xFFFF, word >> 16]
    return np.array(elements, dtype=np.uint16).view(np.int16)
