"""The GPU decode kernel through the C ABI, against the CPU decoder and the peer (skips without a
usable GPU, with the library's reason)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import BPWS, FIXTURES

import trellisforge
from trellisforge import TrellisError

AVAILABLE, REASON = trellisforge.cuda_available()


def test_cuda_decode_fails_cleanly_without_a_gpu():
    if AVAILABLE:
        pytest.skip("a GPU is present")
    checkpoint = trellisforge.Checkpoint(FIXTURES / "peer_weights_3.0bpw.safetensors")
    with pytest.raises(TrellisError) as caught:
        checkpoint.decode_trellis("model.layers.1.self_attn.q_proj", backend="cuda")
    assert caught.value.status_name == "cuda" and "CUDA unavailable" in str(caught.value)


@pytest.mark.skipif(not AVAILABLE, reason=f"no usable GPU: {REASON}")
@pytest.mark.parametrize("bpw", BPWS)
def test_cuda_decode_is_bit_exact(bpw):
    checkpoint = trellisforge.Checkpoint(FIXTURES / f"peer_weights_{bpw}bpw.safetensors")
    for prefix in ("lm_head", "model.layers.1.self_attn.q_proj", "model.layers.1.mlp.experts.0.down_proj"):
        cpu = checkpoint.decode_trellis(prefix)
        gpu = checkpoint.decode_trellis(prefix, backend="cuda")
        assert np.array_equal(cpu.view(np.uint16), gpu.view(np.uint16)), prefix
