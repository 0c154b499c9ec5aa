"""Plain numpy reading and writing of safetensors files: for tests, tools and the quantizer.

bf16 has no numpy dtype; it is read as uint16 bits (see `bf16_to_float32`)."""
from __future__ import annotations

import json
import os
import struct

import numpy as np

NUMPY_DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
    "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "U32": np.uint32, "F32": np.float32,
    "I64": np.int64, "U64": np.uint64, "F64": np.float64,
}
DTYPE_NAMES = {np.dtype(v).str: k for k, v in NUMPY_DTYPES.items() if k != "BF16"}


def read_header(path: str | os.PathLike) -> tuple[dict, int]:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length)), 8 + length


def load(path: str | os.PathLike, names: list[str] | None = None) -> dict[str, np.ndarray]:
    header, data_start = read_header(path)
    out = {}
    with open(path, "rb") as f:
        for name, entry in header.items():
            if name == "__metadata__" or (names is not None and name not in names):
                continue
            begin, end = entry["data_offsets"]
            f.seek(data_start + begin)
            raw = f.read(end - begin)
            out[name] = np.frombuffer(raw, dtype=NUMPY_DTYPES[entry["dtype"]]).reshape(entry["shape"]).copy()
    return out


def save(path: str | os.PathLike, tensors: dict[str, np.ndarray], dtypes: dict[str, str] | None = None,
         metadata: dict[str, str] | None = None) -> None:
    """Writes tensors in name order, 8-byte aligned. `dtypes` overrides a name's dtype label
    (e.g. "BF16" for uint16 bits)."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    blobs = []
    offset = 0
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        label = (dtypes or {}).get(name) or DTYPE_NAMES[array.dtype.str]
        blob = array.tobytes()
        header[name] = {"dtype": label, "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    tmp = f"{os.fspath(path)}.partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)
