"""trellisforge.same_bits, the tool that says whether two builds or switch settings compute the same
logits bit for bit: on the CPU backend, two recordings of the same weights compare equal, and
weights from another seed are named as differing, with the size of the difference."""
from __future__ import annotations

import numpy as np

from trellisforge import Engine, same_bits

BATCHES = ([1], [3], [2, 2])


def save(path, seed):
    with Engine.synthetic("tiny", bits=3, seed=seed, backend="cpu", max_seqs=4, ctx=64, rows_max=16) as engine:
        out = same_bits.cases(engine, "tiny", BATCHES)
    np.savez(path, **out)
    return out


def test_the_same_weights_record_the_same_bits_and_other_weights_are_named(tmp_path):
    a, b, c = (str(tmp_path / f"{n}.npz") for n in "abc")
    recorded = save(a, 0)
    save(b, 0)
    save(c, 1)
    assert len(recorded) == 2 * len(BATCHES)
    assert [recorded[f"tiny:{s}:head"].shape[0] for s in ([1], [3], [2, 2])] == [1, 3, 4]
    assert same_bits.compare([a, b]) == [f"{b} against {a}: 3 of 3 cases bit for bit equal"]
    lines = same_bits.compare([a, c])
    assert lines[0] == f"{c} against {a}: 0 of 3 cases bit for bit equal" and len(lines) == 4
    assert all("differs" in line and "max |difference| / max |logit|" in line for line in lines[1:])
    assert same_bits.main(["compare", a, b]) == 0 and same_bits.main(["compare", a, c]) == 1
