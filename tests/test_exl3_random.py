"""The library's EXL3 decode, dequantize and linear against the float64 numpy reference
(python/trellisforge/reference/exl3.py, written from shared/EXL3.md) on random trellis words, for
every rate and every codebook."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import relative_l2, within
from exl3_files import random_layer, write

import trellisforge
from trellisforge.reference import exl3 as ref

INTEGER_BITS = [1, 2, 3, 4, 5, 6, 7, 8]
HALF_BITS = [1.5, 2.5, 3.5]  # MUL1 only (EXL3.md §7)
CASES = [(b, cb) for b in INTEGER_BITS for cb in ref.CODEBOOKS] + [(b, "mul1") for b in HALF_BITS]
# f32 arithmetic against float64 over in_features <= 384 terms and two 128-point Hadamards.
TOL_F32 = 1e-5


@pytest.mark.parametrize("bits,codebook", CASES)
def test_random_trellis_against_reference(tmp_path, bits, codebook):
    rng = np.random.default_rng(int(bits * 10) * 7 + len(codebook))
    rows, columns = 384, 256
    tensors = random_layer(rng, "layer", rows, columns, bits, codebook)
    write(tmp_path / "layer.safetensors", tensors)
    checkpoint = trellisforge.Checkpoint(tmp_path / "layer.safetensors")

    info = checkpoint.exl3_info("layer")
    assert (info.bits, info.codebook, info.in_features_padded, info.out_features_padded) == (bits, codebook, rows, columns)

    inner = ref.decode_trellis(tensors["layer.trellis"], codebook)
    assert np.array_equal(checkpoint.decode_trellis("layer").view(np.uint16), inner.view(np.uint16))

    w = ref.weight(inner, tensors["layer.suh"], tensors["layer.svh"])
    in_features, out_features = 300, 200  # padding trimmed on both sides
    within(relative_l2(checkpoint.dequantize("layer", in_features, out_features), w[:in_features, :out_features]),
           TOL_F32, f"dequantize K={bits} {codebook}")

    x = rng.standard_normal((5, in_features)).astype(np.float32)
    y = checkpoint.linear("layer", x, out_features)
    expected = ref.linear(x, w, tensors["layer.bias"])[:, :out_features]
    within(relative_l2(y, expected), TOL_F32, f"linear K={bits} {codebook}")


def test_linear_rows_are_independent_of_the_batch(tmp_path):
    """Each output row depends on its input row only, bit for bit, whatever the batch and threads."""
    rng = np.random.default_rng(5)
    write(tmp_path / "l.safetensors", random_layer(rng, "l", 256, 384, 3, "mul1"))
    checkpoint = trellisforge.Checkpoint(tmp_path / "l.safetensors")
    x = rng.standard_normal((9, 256)).astype(np.float32)
    batched = checkpoint.linear("l", x)
    for row in range(x.shape[0]):
        alone = checkpoint.linear("l", x[row:row + 1])
        assert np.array_equal(alone[0].view(np.uint32), batched[row].view(np.uint32))


def test_legacy_packed_signs_decode_as_plus_minus_one(tmp_path):
    rng = np.random.default_rng(9)
    tensors = random_layer(rng, "l", 128, 128, 4, "mcg", bias=False)
    su_words = rng.integers(-32768, 32768, size=8, dtype=np.int16)
    sv_words = rng.integers(-32768, 32768, size=8, dtype=np.int16)
    del tensors["l.suh"], tensors["l.svh"]
    tensors["l.su"], tensors["l.sv"] = su_words, sv_words
    write(tmp_path / "l.safetensors", tensors)

    def unpack(words):
        bits = (words.view(np.uint16)[:, None] >> np.arange(16)) & 1
        return np.where(bits.reshape(-1) == 1, -1.0, 1.0)

    w = ref.weight(ref.decode_trellis(tensors["l.trellis"], "mcg"), unpack(su_words), unpack(sv_words))
    ours = trellisforge.Checkpoint(tmp_path / "l.safetensors").dequantize("l")
    within(relative_l2(ours, w), TOL_F32, "legacy su/sv")
