"""The trellis GEMV's tile loop in machine instructions (trellisforge/gemv_sass.py), against the
counts it has now: the GEMV is bound by issuing its decode's instructions, so a change that makes
the loop longer is caught here before a GPU times it. Needs the installed fatbins and a cuobjdump
that disassembles (the pinned nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels), no GPU."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "python" / "trellisforge"))
import gemv_sass  # noqa: E402  (imported standalone: it must not load the library)
import kernel_contract  # noqa: E402

FATBIN = ROOT / "zig-out" / "kernels" / "glm_forward.fatbin"
# MUL1, sm_90, instructions per 8 tiles at 3 and 4 bits, per tile loop of a kernel: the one-row
# kernels have one, the grouped ones one for a group of up to four rows (one n8 block of products)
# and one for all their blocks (exl3_gemv.cuh gemv_tiles). docs/measurements.md, fourteenth session
# of 2026-12-06: 402 / 394 one row where two mma a tile took 420 / 412; 401 and 413 / 393 and 407
# for the 8-row kernel where 416 / 409; 404 and 441 / 395 and 436 for the 16-row one where 454 / 444.
BUDGET = {
    "tf_exl3_item_linear": [(402, 394)],
    "tf_exl3_shared_item_linear": [(402, 394)],  # runs of up to four rows: one n8 block, as one row
    "tf_exl3_parts_linear": [(402, 394)],
    "tf_exl3_parts_linear4": [(401, 394)],  # a plain layer's 2 to 4 rows: one n8 block, as one row
    "tf_exl3_group_linear4": [(401, 393)],
    "tf_exl3_group_linear8": [(401, 393), (413, 407)],
    "tf_exl3_group_linear": [(404, 395), (441, 436)],
}


def disassembles() -> bool:
    try:
        return bool(gemv_sass.sass(str(FATBIN), "tf_exl3_item_linear"))
    except (FileNotFoundError, subprocess.CalledProcessError):
        return False


pytestmark = [
    pytest.mark.skipif(not FATBIN.is_file(), reason="zig-out/kernels holds no fatbins: the library was built without -Dnvcc"),
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH: the counts are its compiler's"),
]


def test_each_rate_has_its_own_cut_signature():
    signatures = [frozenset(gemv_sass.cut_signature(k)) for k in range(1, 9)]
    assert len(set(signatures)) == 8


def test_every_gemv_kernel_has_one_tile_loop_per_rate():
    if not disassembles():
        pytest.skip("cuobjdump cannot disassemble here (nvdisasm missing)")
    for kernel, budgets in BUDGET.items():
        loops = gemv_sass.mul1_loops(gemv_sass.sass(str(FATBIN), kernel))
        assert sorted(loops) == list(range(1, 9)) and all(len(v) == len(budgets) for v in loops.values()), (kernel, loops)


def test_the_3_and_4_bit_loops_stay_within_their_counts():
    if not disassembles():
        pytest.skip("cuobjdump cannot disassemble here (nvdisasm missing)")
    version, _ = kernel_contract.read_registry()
    if kernel_contract.nvcc_version() != version:
        pytest.skip(f"nvcc {kernel_contract.nvcc_version()} is not the registry's {version}: the counts are that compiler's")
    for kernel, budgets in BUDGET.items():
        loops = gemv_sass.mul1_loops(gemv_sass.sass(str(FATBIN), kernel))
        # The shorter loop is the one-block one.
        for at_three, at_four, (three, four) in zip(sorted(loops[3]), sorted(loops[4]), budgets):
            assert at_three <= three and at_four <= four, (kernel, loops[3], loops[4])
