"""Every kernel that starts asynchronous copies (cp.async) also commits them to a group and waits
for it, in the PTX nvcc makes of our sources. nvcc once compiled an `if constexpr` without braces
before the commit's inline asm into entries with the copies and the wait but no commit: the wait
then covered nothing and the tiles were read before they landed (NaN logits for prompts prefilled
over several steps, docs/measurements.md, ninth session), a race no sanitizer showed. Needs nvcc,
no GPU."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from conftest import ROOT

NVCC = shutil.which("nvcc")
SOURCES = ROOT / "zig" / "kernels" / "cuda"


def unpaired_copies(ptx: str) -> list[str]:
    """Entries of `ptx` that issue cp.async copies without a commit_group or a wait_group."""
    problems = []
    for match in re.finditer(r"\.entry (\w+)\(", ptx):
        end = ptx.find("\n}\n", match.start())
        body = ptx[match.start():end]
        copies = len(re.findall(r"cp\.async\.c[ag]\.", body))
        if copies and ("cp.async.commit_group" not in body or not re.search(r"cp\.async\.wait_(group|all)", body)):
            problems.append(f"{match.group(1)}: {copies} cp.async copies, commit {body.count('cp.async.commit_group')}, "
                            f"wait {len(re.findall(r'cp.async.wait_(?:group|all)', body))}")
    return problems


def test_the_check_finds_an_entry_without_its_commit():
    ptx = (".entry good(\n{\ncp.async.cg.shared.global [%r1], [%rd1], 16, %r2;\ncp.async.commit_group;\ncp.async.wait_group 0;\n}\n"
           ".entry bad(\n{\ncp.async.cg.shared.global [%r1], [%rd1], 16, %r2;\ncp.async.wait_group 0;\n}\n")
    assert unpaired_copies(ptx) == ["bad: 1 cp.async copies, commit 0, wait 1"]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the kernels cannot be compiled here")
def test_every_kernel_commits_and_waits_for_its_copies(tmp_path):
    # The sources whose headers or bodies issue cp.async (textual includes, one level is enough here).
    users = {p.name for p in SOURCES.glob("*.cuh") if "copy16_async" in p.read_text() or "cp.async" in p.read_text()}
    sources = [p for p in sorted(SOURCES.glob("*.cu"))
               if "cp.async" in p.read_text() or any(f'"{h}"' in p.read_text() for h in users)]
    assert any(p.name == "glm_forward.cu" for p in sources) and any(p.name == "mla.cu" for p in sources)
    problems = []
    for source in sources:
        out = tmp_path / (source.stem + ".ptx")
        subprocess.run([NVCC, "-ptx", "-O3", "-std=c++17", "-arch=sm_90", "-o", str(out), str(source)], check=True, timeout=600)
        problems += [f"{source.name} {p}" for p in unpaired_copies(out.read_text())]
    assert problems == []
