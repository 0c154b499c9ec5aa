"""Every kernel that starts asynchronous copies (cp.async) also commits them to a group and waits
for it, in the PTX nvcc makes of our sources. nvcc once compiled an `if constexpr` without braces
before the commit's inline asm into entries with the copies and the wait but no commit: the wait
then covered nothing and the tiles were read before they landed (NaN logits for prompts prefilled
over several steps, docs/measurements.md, ninth session), a race no sanitizer showed. Needs nvcc,
no GPU."""
from __future__ import annotations

import re

from conftest import ptx_entries


def unpaired_copies(ptx: str) -> list[str]:
    """Entries of `ptx` that issue cp.async copies without a commit_group or a wait_group."""
    problems = []
    for name, body in ptx_entries(ptx):
        copies = len(re.findall(r"cp\.async\.c[ag]\.", body))
        if copies and ("cp.async.commit_group" not in body or not re.search(r"cp\.async\.wait_(group|all)", body)):
            problems.append(f"{name}: {copies} cp.async copies, commit {body.count('cp.async.commit_group')}, "
                            f"wait {len(re.findall(r'cp.async.wait_(?:group|all)', body))}")
    return problems


def test_the_check_finds_an_entry_without_its_commit():
    ptx = (".entry good(\n{\ncp.async.cg.shared.global [%r1], [%rd1], 16, %r2;\ncp.async.commit_group;\ncp.async.wait_group 0;\n}\n"
           ".entry bad(\n{\ncp.async.cg.shared.global [%r1], [%rd1], 16, %r2;\ncp.async.wait_group 0;\n}\n")
    assert unpaired_copies(ptx) == ["bad: 1 cp.async copies, commit 0, wait 1"]


def test_every_kernel_commits_and_waits_for_its_copies(sm90_ptx):
    assert "glm_forward.cu" in sm90_ptx and "mla.cu" in sm90_ptx
    problems = []
    for name, ptx in sm90_ptx.items():
        problems += [f"{name} {p}" for p in unpaired_copies(ptx)]
    assert problems == []
