"""TrellisForge: GLM mixture-of-experts inference on EXL3 weights.

The compute lives in the Zig library `libtrellisforge.so`; this package binds it with cffi in ABI
mode. The library is found through `TRELLISFORGE_LIB`, beside this package, or in the source tree's
`zig-out/lib`.
"""
from ._ffi import TrellisError, cuda_available, cuda_device_count, library_path, version
from .checkpoint import Checkpoint, Exl3Info
from .engine import Engine, Sampling, TokenEvent, run_tp_worker
from . import tokenizer

__all__ = ["Checkpoint", "Engine", "Exl3Info", "Sampling", "TokenEvent", "run_tp_worker", "TrellisError", "cuda_available", "cuda_device_count", "library_path", "version"]
