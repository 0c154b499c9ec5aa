"""A short demonstration of the Python API until the server exists: open an EXL3 checkpoint, list
its quantized linears, and run one on the CPU.

    python -m trellisforge.demo [CHECKPOINT]     (default: the peer fixture in tests/fixtures)
"""
from __future__ import annotations

import pathlib
import sys
import time

import numpy as np

import trellisforge

DEFAULT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "glm4_moe" / "peer_weights_3.0bpw.safetensors"


def main(argv: list[str]) -> int:
    path = pathlib.Path(argv[0]) if argv else DEFAULT
    print(f"trellisforge {trellisforge.version()} ({trellisforge.library_path()})")
    available, reason = trellisforge.cuda_available()
    print("CUDA: available" if available else reason)
    checkpoint = trellisforge.Checkpoint(path)
    prefixes = sorted({n.rsplit(".", 1)[0] for n in checkpoint.tensor_names() if n.endswith(".trellis")})
    print(f"{path}: {len(prefixes)} EXL3 linears")
    for prefix in prefixes:
        info = checkpoint.exl3_info(prefix)
        print(f"  {prefix}: {info.in_features_padded}x{info.out_features_padded}, {info.bits:g} bits, {info.codebook}")
    prefix = prefixes[0]
    info = checkpoint.exl3_info(prefix)
    x = np.random.default_rng(0).standard_normal((4, info.in_features_padded)).astype(np.float32)
    start = time.perf_counter()
    y = checkpoint.linear(prefix, x)
    elapsed_ms = (time.perf_counter() - start) * 1e3
    print(f"{prefix}: y = x @ W for 4 rows in {elapsed_ms:.2f} ms; y[0, :4] = {np.array2string(y[0, :4], precision=4)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
