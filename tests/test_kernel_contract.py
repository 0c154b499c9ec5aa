"""The kernel contract (zig/src/core/contract/registry.zig) against the fatbins nvcc builds: no
drift in registers or shared memory, no spills, no unlisted kernel, for every supported arch. Needs
nvcc (on CI's machine) but no GPU."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "python" / "trellisforge"))
import kernel_contract  # noqa: E402  (imported standalone: it must not load the library)

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the kernels cannot be built here")
INSTALLED = sorted((ROOT / "zig-out" / "kernels").glob("*.fatbin"))


def test_every_arch_keeps_the_contract():
    result = subprocess.run([sys.executable, "-m", "ziglang", "build", "test-kernel-contract", f"-Dnvcc={NVCC}",
                             f"-Dpython={sys.executable}"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_installed_fatbins_keep_the_contract():
    if not INSTALLED:
        pytest.skip("zig-out/kernels holds no fatbins: the library was built without -Dnvcc")
    assert kernel_contract.check([str(f) for f in INSTALLED]) == []


def test_drift_spills_and_unlisted_kernels_are_caught(monkeypatch, tmp_path):
    if not INSTALLED:
        pytest.skip("zig-out/kernels holds no fatbins: the library was built without -Dnvcc")
    text = kernel_contract.REGISTRY.read_text()
    edited = text.replace('.kernel = "tf_rmsnorm", .sm = 90, .registers = ', '.kernel = "tf_rmsnorm", .sm = 90, .registers = 1', 1)
    edited = edited.replace('    .{ .kernel = "tf_swiglu", .sm = 90,', '    // .{ .kernel = "tf_swiglu", .sm = 90,', 1)
    registry = tmp_path / "registry.zig"
    registry.write_text(edited)
    monkeypatch.setattr(kernel_contract, "REGISTRY", registry)
    problems = kernel_contract.check([str(f) for f in INSTALLED])
    assert any("tf_rmsnorm sm_90 drifted" in p for p in problems)
    assert any("tf_swiglu sm_90 is in glm_forward.fatbin but not in the registry" in p for p in problems)
    assert any("nvcc" in p for p in kernel_contract.check([str(f) for f in INSTALLED], nvcc="99.9.9"))
