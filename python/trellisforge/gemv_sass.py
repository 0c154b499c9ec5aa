"""What one 8-tile iteration of the trellis GEMV costs in machine instructions, per kernel and rate:
the MUL1 tile loops of tf_exl3_item_linear and its siblings read from a fatbin's SASS.

    python -m trellisforge.gemv_sass FATBIN [KERNEL...]     a table (sm_90, glm_forward's GEMVs by default)

The GEMV is bound by issuing its decode's instructions (docs/measurements.md), so the loop's count
is what a change to it is judged by before a GPU times it. A loop is found as a backward branch
whose body holds 64 MUL1 state multiplies (8 tiles x 8 weights a lane) and dp4a; its rate K by the
compile-time shifts that cut its states out of the lane's words."""
from __future__ import annotations

import collections
import re
import subprocess
import sys

try:
    from .kernel_contract import cuobjdump
except ImportError:  # imported standalone, as the tests do: it must not load the library
    from kernel_contract import cuobjdump

GEMV_KERNELS = ("tf_exl3_item_linear", "tf_exl3_shared_item_linear", "tf_exl3_parts_linear", "tf_exl3_parts_linear4", "tf_exl3_group_linear4",
                "tf_exl3_group_linear8", "tf_exl3_group_linear")
MUL1_MULTIPLIER = "-0x7c232ed3"  # 0x83DCD12D as SASS prints the immediate


def cut_signature(k: int) -> set[tuple[str, int]]:
    """The shifts that cut a lane's eight states at rate K out of its aligned words
    (exl3_tile_decode.cuh): a state at bit b <= 16 of a word is a right shift by 16 - b (none at
    16), one past bit 16 straddles two words and is a funnel shift by b."""
    signature = set()
    for e in range(8):
        bit = e * k % 32
        if bit < 16:
            signature.add(("R", 16 - bit))
        elif bit > 16:
            signature.add(("F", bit))
    return signature


SIGNATURES = {k: cut_signature(k) for k in range(1, 9)}
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA (?:`\(.*?\) )?0x([0-9a-f]+)")
CUTS = re.compile(r"SHF\.(L\.W|R)\.U32\.HI R\d+, R(?:\d+|Z), 0x([0-9a-f]+)")


def sass(fatbin: str, kernel: str, arch: int = 90) -> list[tuple[int, str]]:
    """(address, instruction) of one kernel's code for one arch."""
    text = subprocess.run([cuobjdump(), "-sass", "-arch", f"sm_{arch}", "-fun", kernel, fatbin], capture_output=True, text=True, check=True).stdout
    return [(int(m.group(1), 16), m.group(2)) for m in map(INSTRUCTION.search, text.splitlines()) if m]


def mul1_loops(code: list[tuple[int, str]]) -> dict[int, list[int]]:
    """Rate K -> instruction counts of the MUL1 8-tile loops at that rate."""
    at = {address: i for i, (address, _) in enumerate(code)}
    found = collections.defaultdict(list)
    for i, (address, text) in enumerate(code):
        branch = BRANCH.search(text)
        if branch is None:
            continue
        target = int(branch.group(1), 16)
        if target >= address or target not in at:
            continue
        body = [t for _, t in code[at[target]:i + 1]]
        if sum(MUL1_MULTIPLIER in t for t in body) != 64 or not any(t.split()[0].startswith("IDP") for t in body if t):
            continue
        cuts = {("F" if m.group(1) == "L.W" else "R", int(m.group(2), 16)) for m in map(CUTS.search, body) if m}
        # The rate whose cuts the loop's shifts match best (the compiler may do one another way).
        rate = max(SIGNATURES, key=lambda k: len(cuts & SIGNATURES[k]) / len(cuts | SIGNATURES[k]))
        found[rate].append(len(body))
    return dict(found)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    fatbin, kernels = argv[0], argv[1:] or list(GEMV_KERNELS)
    rates = range(1, 9)
    print("MUL1 tile loop, instructions per 8 tiles (sm_90; a grouped kernel's loops for one n8 block / all)")
    width = max(len("kernel"), *map(len, kernels)) + 2
    print(f"{'kernel':<{width}}" + "".join(f"{'K = ' + str(k):>9}" for k in rates))
    for kernel in kernels:
        loops = mul1_loops(sass(fatbin, kernel))
        print(f"{kernel:<{width}}" + "".join(f"{'/'.join(map(str, sorted(loops[k]))) if k in loops else '-':>9}" for k in rates))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
