"""A checkpoint opened by the library: tensor listing and EXL3 linear layers."""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from ._ffi import check, ffi, lib

DTYPE_NAMES = ["BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "I64", "U64", "F64"]
CODEBOOK_NAMES = {0: "3inst", 1: "mcg", 2: "mul1"}


@dataclasses.dataclass(frozen=True)
class Exl3Info:
    in_features_padded: int
    out_features_padded: int
    bits: float  # 1..8, or 1.5 / 2.5 / 3.5
    codebook: str  # "3inst", "mcg" or "mul1"
    has_bias: bool


class Checkpoint:
    """A safetensors file, or a directory with model.safetensors or an index and its shards."""

    def __init__(self, path: str | os.PathLike):
        handle = ffi.new("tf_checkpoint **")
        check(lib.tf_checkpoint_open(os.fsencode(os.fspath(path)), handle))
        self._handle = handle[0]

    def close(self) -> None:
        if self._handle is not None:
            check(lib.tf_checkpoint_close(self._handle))
            self._handle = None

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            lib.tf_checkpoint_close(self._handle)
            self._handle = None

    def _live(self):
        if self._handle is None:
            raise ValueError("checkpoint is closed")
        return self._handle

    def tensor_names(self) -> list[str]:
        return [name for name, _, _ in self.tensors()]

    def tensors(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(name, dtype, shape) of every tensor, sorted by name."""
        handle = self._live()
        count = ffi.new("size_t *")
        check(lib.tf_checkpoint_tensor_count(handle, count))
        info = ffi.new("tf_tensor_info *")
        out = []
        for index in range(count[0]):
            check(lib.tf_checkpoint_tensor_info(handle, index, info))
            name = ffi.unpack(info.name, info.name_len).decode("utf-8", "replace")
            out.append((name, DTYPE_NAMES[info.dtype], tuple(info.shape[i] for i in range(info.rank))))
        return out

    def quantization(self) -> dict | None:
        """config.json's quantization_config as the library read it, or None."""
        info = ffi.new("tf_quantization_info *")
        check(lib.tf_checkpoint_quantization(self._live(), info))
        if not info.present:
            return None
        return {
            "bits": info.bits,
            "head_bits": info.head_bits or None,
            "codebook": CODEBOOK_NAMES.get(info.codebook),
        }

    def exl3_info(self, prefix: str) -> Exl3Info:
        info = ffi.new("tf_exl3_info *")
        check(lib.tf_exl3_info_get(self._live(), prefix.encode(), info))
        return Exl3Info(
            in_features_padded=info.in_features_padded,
            out_features_padded=info.out_features_padded,
            bits=info.bits_x2 / 2,
            codebook=CODEBOOK_NAMES[info.codebook],
            has_bias=bool(info.has_bias),
        )

    def decode_trellis(self, prefix: str, backend: str = "cpu") -> np.ndarray:
        """Wq, the trellis decode before the Hadamards: float16 (k_p, n_p), bit-exact.

        backend "cuda" runs the GPU kernel (TrellisError when CUDA is unavailable)."""
        decode = {"cpu": lib.tf_exl3_decode_trellis, "cuda": lib.tf_exl3_decode_trellis_cuda}.get(backend)
        if decode is None:
            raise ValueError(f"backend must be 'cpu' or 'cuda', not {backend!r}")
        info = self.exl3_info(prefix)
        out = np.empty((info.in_features_padded, info.out_features_padded), dtype=np.float16)
        check(decode(self._live(), prefix.encode(), ffi.cast("uint16_t *", out.ctypes.data), out.size))
        return out

    def dequantize(self, prefix: str, in_features: int | None = None, out_features: int | None = None) -> np.ndarray:
        """W as float32 (in_features, out_features), y = x @ W orientation, padding removed.

        The checkpoint stores padded sizes only; pass the model's sizes to drop the padding."""
        info = self.exl3_info(prefix)
        rows = in_features or info.in_features_padded
        columns = out_features or info.out_features_padded
        out = np.empty((rows, columns), dtype=np.float32)
        check(lib.tf_exl3_dequantize(
            self._live(), prefix.encode(), rows, columns, ffi.cast("float *", out.ctypes.data), out.size))
        return out

    def linear(self, prefix: str, x: np.ndarray, out_features: int | None = None) -> np.ndarray:
        """y = x @ W + bias for float32 x of shape (rows, in_features)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2:
            raise ValueError(f"x must be (rows, in_features), got shape {x.shape}")
        columns = out_features or self.exl3_info(prefix).out_features_padded
        y = np.empty((x.shape[0], columns), dtype=np.float32)
        check(lib.tf_exl3_linear(
            self._live(), prefix.encode(), ffi.cast("float *", x.ctypes.data), x.shape[0], x.shape[1],
            ffi.cast("float *", y.ctypes.data), columns))
        return y
