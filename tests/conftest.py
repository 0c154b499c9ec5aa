"""Shared test setup: the package from python/, fixture locations, tolerance reporting."""
from __future__ import annotations

import os
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

FIXTURES = ROOT / "tests" / "fixtures" / "glm4_moe"
# TF_SHARED_FIXTURES points elsewhere where ../shared is not beside the checkout (the GPU machine).
SHARED = pathlib.Path(os.environ.get("TF_SHARED_FIXTURES", ROOT.parent / "shared" / "fixtures" / "glm4_moe"))
BPWS = ("3.0", "4.0")


def shared_or_skip() -> pathlib.Path:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent: this check reads peer data too large to copy into tests/")
    return SHARED


def relative_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    expected = np.asarray(expected, dtype=np.float64)
    denominator = np.linalg.norm(expected)
    return float(np.linalg.norm(np.asarray(actual, dtype=np.float64) - expected) / max(denominator, 1e-300))


def within(error: float, tolerance: float, what: str) -> None:
    """Asserts error <= tolerance and prints the ratio, so `pytest -s` shows how close it came."""
    ratio = error / tolerance
    print(f"{what}: error {error:.3g} = {ratio:.3f} x tol ({tolerance:.1g})")
    assert np.isfinite(error) and ratio <= 1.0, f"{what}: error {error:.3g} is {ratio:.2f} x the tolerance {tolerance:.1g}"


KERNEL_SOURCES = ROOT / "zig" / "kernels" / "cuda"


@pytest.fixture(scope="session")
def sm90_ptx(tmp_path_factory) -> dict[str, str]:
    """The PTX nvcc makes of every kernel source for sm_90, by file name, compiled once per session
    for the checks that read it (tests/test_kernel_*.py). Needs nvcc, no GPU."""
    import shutil
    import subprocess
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: the kernels cannot be compiled here")
    out_dir = tmp_path_factory.mktemp("ptx")
    ptx = {}
    for source in sorted(KERNEL_SOURCES.glob("*.cu")):
        out = out_dir / (source.stem + ".ptx")
        subprocess.run([nvcc, "-ptx", "-O3", "-std=c++17", "-arch=sm_90", "-o", str(out), str(source)], check=True, timeout=600)
        ptx[source.name] = out.read_text()
    return ptx


def ptx_entries(ptx: str) -> list[tuple[str, str]]:
    """(name, body) of each .entry of `ptx`, to the brace that closes it: inline asm such as
    `{add.f16 ...;\n}` puts a "}" at a line's start inside a body, so the first one is not the end."""
    import re
    braces = re.compile(r"[{}]")
    entries = []
    for match in re.finditer(r"\.entry (\w+)\(", ptx):
        depth = 0
        for brace in braces.finditer(ptx, ptx.index("{", match.end())):  # scans in place, no copy of the rest
            depth += 1 if brace.group(0) == "{" else -1
            if depth == 0:
                break
        entries.append((match.group(1), ptx[match.start():brace.end()]))
    return entries
