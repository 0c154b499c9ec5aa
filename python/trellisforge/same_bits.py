"""Whether two builds, or two settings of one build's switches, compute the same logits bit for bit
(a tool for judging a change that promises to keep the numbers, not a test):

    TRELLISFORGE_LIB=A.so python -m trellisforge.same_bits record A.npz --backend cuda [--checkpoint DIR]
    TRELLISFORGE_LIB=B.so python -m trellisforge.same_bits record B.npz --backend cuda [--checkpoint DIR]
    python -m trellisforge.same_bits compare A.npz B.npz [C.npz ...]

`record` runs fixed prompts through synthetic 4-layer cuts of each class (random EXL3 weights from
a fixed seed: the same weights in every build) and, with --checkpoint, through a checkpoint, at
several row counts and one batch of three sequences, and keeps per case a SHA-256 of the whole
logits and their first 2048 columns. Run it with TF_CUDA_PROMPT=0 to put every row on the GEMV
path. `compare` names the cases that differ from the first file's, with their largest difference
in those columns relative to the largest logit; it exits 1 when any case differs."""
from __future__ import annotations

import argparse
import hashlib
import sys
import time

import numpy as np

from . import Engine

SHAPES = [("glm-4.5-air-4l", 3), ("glm-4.5-air-4l", 4), ("glm-4.7-flash-4l", 3), ("glm-5.3-flash-4l", 3)]
BATCHES = ([1], [3], [6], [24], [5, 7, 12])
KEPT_COLUMNS = 2048


def prompts(rng: np.random.Generator, sizes: list[int], vocab: int) -> list[list[int]]:
    return [list(map(int, rng.integers(3, min(vocab, 5000), size=s))) for s in sizes]


def cases(engine: Engine, name: str, batches, seed: int = 7) -> dict[str, np.ndarray]:
    """Per batch: the SHA-256 of its logits and their first KEPT_COLUMNS columns."""
    rng = np.random.default_rng(seed)
    out = {}
    for sizes in batches:
        logits = np.concatenate(engine.logits_batch(prompts(rng, list(sizes), engine.vocab_size)))
        key = f"{name}:{list(sizes)}"
        out[key + ":sha"] = np.frombuffer(hashlib.sha256(logits.tobytes()).digest(), dtype=np.uint8)
        out[key + ":head"] = logits[:, :KEPT_COLUMNS].copy()
    return out


def record(path: str, backend: str, shapes=SHAPES, checkpoint: str | None = None, batches=BATCHES) -> int:
    started = time.time()
    out = {}
    for shape, bits in shapes:
        with Engine.synthetic(shape, bits=bits, backend=backend, max_seqs=8, ctx=512, rows_max=64) as engine:
            out.update(cases(engine, f"{shape}-{bits}bit", batches))
        print(f"{shape} {bits}-bit: {time.time() - started:.0f} s", flush=True)
    if checkpoint:
        with Engine(checkpoint, backend=backend, max_seqs=8) as engine:
            out.update(cases(engine, "checkpoint", batches))
    np.savez(path, **out)
    print(f"{path}: {len(out) // 2} cases", flush=True)
    return len(out) // 2


def compare(paths: list[str]) -> list[str]:
    """The lines `compare` prints; any case that differs from the first file's has a line 'differs'."""
    base = np.load(paths[0])
    names = sorted(k[: -len(":sha")] for k in base.files if k.endswith(":sha"))
    lines = []
    for other_path in paths[1:]:
        other = np.load(other_path)
        same = [n for n in names if n + ":sha" in other.files and np.array_equal(base[n + ":sha"], other[n + ":sha"])]
        lines.append(f"{other_path} against {paths[0]}: {len(same)} of {len(names)} cases bit for bit equal")
        for n in names:
            if n in same:
                continue
            if n + ":head" not in other.files:
                lines.append(f"  {n}: missing")
                continue
            a, b = base[n + ":head"], other[n + ":head"]
            if a.shape != b.shape:
                lines.append(f"  {n}: differs (shapes {a.shape} and {b.shape})")
                continue
            scale = max(float(np.abs(a).max()), 1e-30)
            lines.append(f"  {n}: differs (first {a.shape[1]} columns: max |difference| / max |logit| = "
                         f"{float(np.abs(a - b).max()) / scale:.3g})")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="logits of the fixed cases into an .npz")
    r.add_argument("out")
    r.add_argument("--backend", default="cuda", choices=["cpu", "cuda"])
    r.add_argument("--checkpoint", help="a model directory to run as well")
    r.add_argument("--quick", action="store_true", help="GLM-4.5-Air's 3-bit cut only")
    c = sub.add_parser("compare", help="each file's cases against the first's")
    c.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.out, args.backend, SHAPES[:1] if args.quick else SHAPES, args.checkpoint)
        return 0
    if len(args.files) < 2:
        parser.error("compare needs two files or more")
    lines = compare(args.files)
    print("\n".join(lines))
    return 1 if any("differs" in line or "missing" in line for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
