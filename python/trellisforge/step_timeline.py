"""A decode step's kernel timeline as tables (`bench_engine --profile`): every launch's device time
(up to the next launch's start, so the gaps count and the launches add up to the step), the bytes
of weights or cache it reads where the library states them, and the share of copy bandwidth those
bytes in that time make. Grouped per part of the layer, per kernel, and launch by launch for each
distinct kind of layer."""
from __future__ import annotations

from collections import defaultdict


def _rate(reads: int, micros: float, bandwidth_gbs: float) -> str:
    if not reads or micros <= 0:
        return f"{'':>8} {'':>7}"
    gbs = reads / micros / 1e3
    share = f"{100 * gbs / bandwidth_gbs:>6.1f}%" if bandwidth_gbs else f"{'':>7}"
    return f"{gbs:>8.0f} {share}"


def render(entries: list[dict], step_seconds: float, bandwidth_gbs: float, title: str) -> str:
    total = sum(e["micros"] for e in entries)
    lines = [f"step timeline: {title}: {len(entries)} launches, {total:.1f} us on the timeline, "
             f"{1e6 * step_seconds:.1f} us per step measured without it ({100 * total / (1e6 * step_seconds):.0f}%)"
             if step_seconds else f"step timeline: {title}: {len(entries)} launches, {total:.1f} us"]
    head = f"{'us':>9} {'share':>6} {'MB read':>8} {'GB/s':>8} {'% copy':>7}"

    by_part: dict[str, list] = defaultdict(lambda: [0, 0.0, 0])
    by_kernel: dict[tuple, list] = defaultdict(lambda: [0, 0.0, 0])
    for e in entries:
        for table, key in ((by_part, e["part"]), (by_kernel, (e["name"], e["part"]))):
            table[key][0] += 1
            table[key][1] += e["micros"]
            table[key][2] += e["reads"]
    lines.append(f"{'part':<10} {'launches':>8} {head}")
    for part, (n, micros, reads) in sorted(by_part.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{part:<10} {n:>8} {micros:>9.1f} {100 * micros / total:>5.1f}% {reads / 1e6:>8.2f} {_rate(reads, micros, bandwidth_gbs)}")
    lines.append(f"{'kernel':<34} {'part':<9} {'launches':>8} {'mean us':>8} {head}")
    for (name, part), (n, micros, reads) in sorted(by_kernel.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{name:<34} {part:<9} {n:>8} {micros / n:>8.2f} {micros:>9.1f} {100 * micros / total:>5.1f}% "
                     f"{reads / 1e6:>8.2f} {_rate(reads, micros, bandwidth_gbs)}")

    # Launch by launch: the first layer of each distinct sequence of kernels, then the head.
    layers: dict[int, list[dict]] = defaultdict(list)
    for e in entries:
        layers[e["layer"]].append(e)
    seen = set()
    for layer in sorted(layers):
        launches = layers[layer]
        signature = tuple(e["name"] for e in launches)
        if layer >= 0 and signature in seen:
            continue
        seen.add(signature)
        where = f"layer {layer}" if layer >= 0 else "outside the layers"
        lines.append(f"{where}, launch by launch ({sum(e['micros'] for e in launches):.1f} us):")
        for e in launches:
            lines.append(f"  {e['name']:<34} {e['part']:<9} {e['micros']:>8.2f} us {e['reads'] / 1e6:>8.3f} MB {_rate(e['reads'], e['micros'], bandwidth_gbs)}")
    return "\n".join(lines)
