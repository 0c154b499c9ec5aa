"""Streaming safetensors output: the header is written from the declared tensors, then each tensor's
bytes in order, so memory holds one tensor at a time. Files are written under a temporary name and
renamed when complete; a directory of shards is written beside its final place and renamed last,
so a failed run never leaves output that looks complete."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import struct

import numpy as np

ITEM_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4,
              "F32": 4, "I64": 8, "U64": 8, "F64": 8}


class ShardWriter:
    def __init__(self, path: pathlib.Path, entries: list[tuple[str, str, tuple[int, ...]]], metadata: dict | None = None):
        self.path = pathlib.Path(path)
        self.entries = entries
        header: dict = {"__metadata__": metadata} if metadata else {}
        offset = 0
        for name, dtype, shape in entries:
            size = ITEM_SIZES[dtype] * int(np.prod(shape, dtype=np.int64))
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        self.sizes = {name: header[name]["data_offsets"][1] - header[name]["data_offsets"][0] for name, _, _ in entries}
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)
        self._file = open(self.path, "wb")
        self._file.write(struct.pack("<Q", len(encoded)) + encoded)
        self._next = 0

    def write(self, name: str, array: np.ndarray) -> None:
        expected_name, _, shape = self.entries[self._next]
        data = np.ascontiguousarray(array).tobytes()
        if name != expected_name or len(data) != self.sizes[name] or tuple(array.shape) != tuple(shape):
            raise ValueError(f"tensor {name} {array.shape} written out of order or with the wrong size (expected {expected_name} {shape})")
        self._file.write(data)
        self._next += 1

    def close(self) -> None:
        if self._next != len(self.entries):
            raise ValueError(f"{len(self.entries) - self._next} tensors were declared but not written")
        self._file.close()

    def abort(self) -> None:
        self._file.close()


class OutputDirectory:
    """Writes into `<target>.partial`, renamed to `target` by `commit()`; removed on failure."""

    def __init__(self, target: str | os.PathLike, overwrite: bool = False):
        self.target = pathlib.Path(target)
        if self.target.exists() and any(self.target.iterdir()) and not overwrite:
            raise FileExistsError(f"{self.target} exists and is not empty")
        self.partial = self.target.with_name(self.target.name + ".partial")
        shutil.rmtree(self.partial, ignore_errors=True)
        try:
            self.partial.mkdir(parents=True)
        except OSError as error:
            raise OSError(error.errno, f"cannot write {self.target}: {error.strerror}") from None

    def __enter__(self) -> pathlib.Path:
        return self.partial

    def __exit__(self, kind, value, trace) -> None:
        if kind is not None:
            shutil.rmtree(self.partial, ignore_errors=True)
            return
        if self.target.exists():
            shutil.rmtree(self.target)
        os.replace(self.partial, self.target)
