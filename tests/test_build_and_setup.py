"""The build and the set-up as a user runs them again: a second `zig build -Dnvcc` with nothing
changed runs no nvcc (its summary shows every fatbin cached), while the nvcc version stays an input
of every fatbin; scripts/setup.sh says what it is doing and how long each part took."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

NVCC = os.environ.get("TF_NVCC") or shutil.which("nvcc")
FATBIN_RUN = re.compile(r"run (\S*nvcc) \((\w+)\.fatbin\) (\w+)")


def build_summary() -> str:
    done = subprocess.run([sys.executable, "-m", "ziglang", "build", f"-Dnvcc={NVCC}", "--summary", "all"], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


@pytest.mark.skipif(not NVCC, reason="no nvcc on PATH (or TF_NVCC): the CUDA kernels are not built here")
def test_a_rebuild_with_nothing_changed_runs_no_nvcc():
    build_summary()  # whatever the set-up left undone
    summary = build_summary()
    runs = FATBIN_RUN.findall(summary)
    assert runs, summary
    assert {state for _, _, state in runs} == {"cached"}, summary
    # Each fatbin's nvcc step still has the version file among its inputs, listed under it.
    for name in {name for _, name, _ in runs}:
        block = summary.split(f"({name}.fatbin) cached", 1)[1].split("\n+-", 1)[0]
        assert "nvcc-version.txt" in block.splitlines()[1], (name, block)


def test_every_kernel_header_is_an_input_of_the_fatbins():
    """An edited .cuh must rebuild the fatbins that include it: zig/build/cuda.zig lists the headers
    as file inputs of every nvcc step, and a header missing from that list would leave a stale
    kernel in the library without a word."""
    listed = set(re.findall(r'"(\w+\.cuh)"', (ROOT / "zig" / "build" / "cuda.zig").read_text()))
    present = {p.name for p in (ROOT / "zig" / "kernels" / "cuda").glob("*.cuh")}
    assert present, "no kernel headers found"
    assert present == listed, {"not listed": sorted(present - listed), "listed, absent": sorted(listed - present)}


def test_setup_says_what_it_does():
    """A set-up run on an already set-up tree: each step named as it starts and timed as it ends."""
    env = {**os.environ, "TF_NVCC": NVCC or ""}
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for step in ("python environment", "pinned packages", "trellisforge package", "library"):
        started = [line for line in lines if line.startswith("setup:") and step in line and "..." in line]
        finished = [line for line in lines if line.startswith("setup:") and step in line and re.search(r"done in \d+ s", line)]
        assert started and finished, (step, done.stdout)


def test_the_zig_sources_are_formatted():
    """`zig fmt --check` over the host, the tools and the build script: formatting drift shows up in
    review as noise beside real changes."""
    done = subprocess.run([sys.executable, "-m", "ziglang", "fmt", "--check", "zig", "build.zig"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, "unformatted: " + done.stdout + done.stderr
