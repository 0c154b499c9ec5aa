"""A bounded fuzz pass: mutated header bytes of a valid file never crash the reader; each either
opens (and every tensor it lists lies inside the file) or raises TrellisError."""
from __future__ import annotations

import json
import struct

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trellisforge
from trellisforge import TrellisError

HEADER = json.dumps({
    "a.trellis": {"dtype": "I16", "shape": [8, 8, 48], "data_offsets": [0, 6144]},
    "a.suh": {"dtype": "F16", "shape": [128], "data_offsets": [6144, 6400]},
    "a.svh": {"dtype": "F16", "shape": [128], "data_offsets": [6400, 6656]},
    "a.mul1": {"dtype": "I32", "shape": [], "data_offsets": [6656, 6660]},
    "__metadata__": {"format": "pt"},
}).encode()
DATA = np.random.default_rng(0).integers(0, 256, 6660, dtype=np.uint8).tobytes()
VALID = struct.pack("<Q", len(HEADER)) + HEADER + DATA


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 8 + len(HEADER) - 1), st.integers(0, 255)), min_size=1, max_size=6))
def test_mutated_headers_never_crash(tmp_path, edits):
    mutated = bytearray(VALID)
    for at, value in edits:
        mutated[at] = value
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(bytes(mutated))
    try:
        checkpoint = trellisforge.Checkpoint(path)
    except TrellisError as error:
        assert str(error)
        return
    for _, _, shape in checkpoint.tensors():
        assert all(d >= 0 for d in shape)
    try:
        checkpoint.dequantize("a")
    except TrellisError as error:
        assert str(error)
    checkpoint.close()
