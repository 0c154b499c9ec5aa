"""The GPU Viterbi encoder equals the CPU encoder (itself bit-identical to the spec's emulation) bit
for bit, for every K and codebook. Skips where no GPU is usable."""
from __future__ import annotations

import numpy as np
import pytest

import trellisforge
from trellisforge import quantize as q

AVAILABLE, REASON = trellisforge.cuda_available()


@pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("codebook", ["3inst", "mcg", "mul1"])
def test_gpu_encoder_equals_cpu_encoder(bits, codebook):
    rng = np.random.default_rng(bits * 13 + len(codebook))
    values = (rng.standard_normal((6, 256)) * q.CODEBOOK_RMS[codebook]).astype(np.float32)
    values[5] *= 40.0  # large inputs: costs overflow to +inf in fp16, and the tie rules decide
    assert np.array_equal(q.encode_tiles(values, bits, codebook, backend="cuda"), q.encode_tiles(values, bits, codebook, backend="cpu"))


def test_gpu_encoder_without_a_gpu_fails_cleanly():
    if AVAILABLE:
        pytest.skip("a GPU is present")
    with pytest.raises(trellisforge.TrellisError, match="CUDA unavailable"):
        q.encode_tiles(np.zeros((1, 256), np.float32), 3, "mul1", backend="cuda")
