"""The kernel contract: every kernel of every fatbin, per arch, with the registers, static shared
memory, stack and local (spill) bytes recorded in zig/src/core/contract/registry.zig.

    python -m trellisforge.kernel_contract check FATBIN...     exit 1 on drift, a spill, or an unlisted kernel
    python -m trellisforge.kernel_contract write FATBIN...     rewrite the registry from these fatbins

Resource usage is read with `cuobjdump --dump-resource-usage` (from the pinned
nvidia-cuda-cuobjdump wheel when the toolkit lacks it). The registry also records the nvcc version
it was read with: a different nvcc fails the check until the registry is rewritten and reviewed."""
from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
REGISTRY = ROOT / "zig" / "src" / "core" / "contract" / "registry.zig"
ENTRY = re.compile(r'\.\{ \.kernel = "(\w+)", \.sm = (\d+), \.registers = (\d+), \.shared_bytes = (\d+), \.stack_bytes = (\d+), \.local_bytes = (\d+) \}')


@dataclasses.dataclass(frozen=True, order=True)
class Usage:
    kernel: str
    sm: int
    registers: int
    shared_bytes: int
    stack_bytes: int
    local_bytes: int


def cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia  # the nvidia-cuda-cuobjdump wheel
        for base in nvidia.__path__:
            for candidate in pathlib.Path(base).glob("*/bin/cuobjdump"):
                return str(candidate)
    except ImportError:
        pass
    raise FileNotFoundError("cuobjdump not found: install nvidia-cuda-cuobjdump (requirements.txt pins it)")


def read_fatbin(path: str | pathlib.Path) -> list[Usage]:
    text = subprocess.run([cuobjdump(), "--dump-resource-usage", str(path)], capture_output=True, text=True, check=True).stdout
    usages, sm = [], None
    for line in text.splitlines():
        arch = re.match(r"arch = sm_(\d+)", line.strip())
        if arch:
            sm = int(arch.group(1))
        function = re.match(r"\s*Function (\w+):", line)
        if function:
            current = function.group(1)
        fields = dict(re.findall(r"(\w+(?:\[\d+\])?):(\d+)", line))
        if "REG" in fields and sm is not None:
            usages.append(Usage(current, sm, int(fields["REG"]), int(fields["SHARED"]), int(fields["STACK"]), int(fields["LOCAL"])))
    return usages


def nvcc_version() -> str:
    text = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    return re.search(r"V(\d+\.\d+\.\d+)", text).group(1)


def read_registry() -> tuple[str, dict[tuple[str, int], Usage]]:
    text = REGISTRY.read_text()
    version = re.search(r'pub const nvcc_version = "([^"]+)";', text).group(1)
    entries = {}
    for line in text.splitlines():
        match = ENTRY.search(line)
        if match is None or line.lstrip().startswith("//"):
            continue
        usage = Usage(match.group(1), *map(int, match.groups()[1:]))
        entries[(usage.kernel, usage.sm)] = usage
    return version, entries


def check(fatbins: list[str], nvcc: str | None = None) -> list[str]:
    """Problems found; empty when the fatbins keep the contract."""
    version, registry = read_registry()
    nvcc = nvcc or nvcc_version()
    problems = []
    if nvcc != version:
        problems.append(f"the registry was read with nvcc {version}, these fatbins were built with {nvcc}: "
                        "rebuild with that nvcc, or rewrite the registry (`write`) and review the diff")
    seen = 0
    for fatbin in fatbins:
        for usage in read_fatbin(fatbin):
            seen += 1
            key = (usage.kernel, usage.sm)
            if usage.stack_bytes or usage.local_bytes:
                problems.append(f"{usage.kernel} sm_{usage.sm} spills: stack {usage.stack_bytes} B, local {usage.local_bytes} B")
            if key not in registry:
                problems.append(f"{usage.kernel} sm_{usage.sm} is in {pathlib.Path(fatbin).name} but not in the registry")
            elif registry[key] != usage:
                expected = registry[key]
                problems.append(f"{usage.kernel} sm_{usage.sm} drifted: registers {expected.registers} -> {usage.registers}, "
                                f"shared {expected.shared_bytes} -> {usage.shared_bytes} B, stack {expected.stack_bytes} -> "
                                f"{usage.stack_bytes} B, local {expected.local_bytes} -> {usage.local_bytes} B")
    if seen == 0:
        problems.append("no kernels found in the fatbins")
    return problems


def write(fatbins: list[str]) -> None:
    usages = sorted({u for f in fatbins for u in read_fatbin(f)})
    lines = [
        "//! The kernel contract: per kernel and arch, the resources nvcc gave it. `zig build",
        "//! test-kernel-contract` and tests/test_kernel_contract.py compare the built fatbins with this",
        "//! table and fail on drift, on any spill and on any unlisted kernel. Written by",
        "//! `python -m trellisforge.kernel_contract write FATBIN...`; review every change.",
        "",
        "pub const Entry = struct {",
        "    kernel: []const u8,",
        "    sm: u16,",
        "    registers: u16,",
        "    shared_bytes: u32, // static shared memory",
        "    stack_bytes: u32,",
        "    local_bytes: u32, // spills",
        "};",
        "",
        f'pub const nvcc_version = "{nvcc_version()}";',
        "",
        "pub const entries = [_]Entry{",
    ]
    for u in usages:
        lines.append(f'    .{{ .kernel = "{u.kernel}", .sm = {u.sm}, .registers = {u.registers}, .shared_bytes = {u.shared_bytes}, '
                     f'.stack_bytes = {u.stack_bytes}, .local_bytes = {u.local_bytes} }},')
    lines += ["};", "", "test \"the registry lists no spills\" {", "    for (entries) |entry| {",
              "        try @import(\"std\").testing.expectEqual(@as(u32, 0), entry.stack_bytes + entry.local_bytes);", "    }", "}", ""]
    REGISTRY.parent.mkdir(parents=True, exist_ok=True)
    REGISTRY.write_text("\n".join(lines))


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("check", "write"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "write":
        write(argv[1:])
        print(f"wrote {REGISTRY}")
        return 0
    problems = check(argv[1:])
    for problem in problems:
        print(f"FAIL {problem}")
    print("kernel contract: " + ("kept" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
