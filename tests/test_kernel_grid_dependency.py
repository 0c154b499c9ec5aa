"""Every kernel waits for the kernel before it (griddepcontrol.wait) before it touches global
memory, in the PTX nvcc makes of our sources for sm_90. On sm_90 and later every launch lets the
next kernel be scheduled while the one before it finishes (programmatic dependent launch,
cuda/gpu.zig); a kernel that read its inputs, or wrote a buffer its predecessor still reads, before
that wait would race with it. Needs nvcc, no GPU; the GPU side (the same bits with the launches
serialized, TF_CUDA_PDL=0) is in tests/test_cuda_engine.py."""
from __future__ import annotations

import re

from conftest import ptx_entries

# Instructions that reach global memory (or may: generic addresses), and the wait.
GLOBAL = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:ld|st|atom|red|cp\.async|prefetch|ldu)\.(?!param|shared|local|const)[\w.:]*", re.M)
WAIT = re.compile(r"^\s*griddepcontrol\.wait;", re.M)


def early_accesses(ptx: str) -> list[str]:
    """Entries of `ptx` without the wait, or with a global access before it."""
    problems = []
    for name, body in ptx_entries(ptx):
        wait = WAIT.search(body)
        if wait is None:
            problems.append(f"{name}: no griddepcontrol.wait")
            continue
        access = GLOBAL.search(body, 0, wait.start())
        if access:
            problems.append(f"{name}: '{access.group(0).strip()}' before griddepcontrol.wait")
    return problems


def test_the_check_finds_a_missing_or_late_wait():
    ptx = (".entry good(\n{\nld.param.u64 %rd1, [p];\ngriddepcontrol.wait;\nld.global.f32 %f1, [%rd1];\n}\n"
           ".entry late(\n{\nld.param.u64 %rd1, [p];\nld.global.nc.f32 %f1, [%rd1];\ngriddepcontrol.wait;\n}\n"
           ".entry none(\n{\nst.global.f32 [%rd1], %f1;\n}\n"
           ".entry shared(\n{\n@!%p1 ld.shared.f32 %f1, [%r1];\ngriddepcontrol.wait;\n}\n"
           ".entry guarded(\n{\n@!%p1 atom.global.add.u32 %r2, [%rd1], 1;\ngriddepcontrol.wait;\n}\n")
    assert early_accesses(ptx) == ["late: 'ld.global.nc.f32' before griddepcontrol.wait", "none: no griddepcontrol.wait",
                                   "guarded: '@!%p1 atom.global.add.u32' before griddepcontrol.wait"]


def test_every_kernel_waits_for_the_one_before_it(sm90_ptx):
    entries = sum(len(ptx_entries(ptx)) for ptx in sm90_ptx.values())
    assert entries >= 60, entries  # every module compiled, every kernel seen
    problems = []
    for name, ptx in sm90_ptx.items():
        problems += [f"{name} {p}" for p in early_accesses(ptx)]
    assert problems == []
