"""Speculation policy from data: where a speculative configuration crosses its reference.

Pure. From two gate results on the same workload and host class: the ratio of output
tok/s (with a bootstrap CI over runs) at every level both measured, the concurrency
where the ratio crosses 1 (interpolated in log C between the bracketing levels; its
range from where the CI's bounds cross), and what to run where. On measured traffic
(`GateResult.traffic`) it says which one wins overall and by how much.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from stackbuild.gate.result import GateResult
from stackbuild.gate.stats import bootstrap_ratio_ci


@dataclass(frozen=True)
class Point:
    concurrency: int
    ratio: float
    low: float
    high: float


@dataclass(frozen=True)
class Crossing:
    rising: bool  # True: speculation starts paying here; False: stops paying
    at: float
    low: float
    high: float
    between: tuple[int, int]


def points(spec: GateResult, ref: GateResult) -> list[Point]:
    out = []
    for lv in spec.levels:
        other = ref.level(lv.concurrency)
        if other is None or not lv.runs or not other.runs:
            continue
        r, lo, hi = bootstrap_ratio_ci([x.output_tok_s for x in lv.runs],
                                       [x.output_tok_s for x in other.runs],
                                       seed=lv.concurrency)
        out.append(Point(lv.concurrency, r, lo, hi))
    return out


def _cross(c0: int, y0: float, c1: int, y1: float) -> float | None:
    """Where y crosses 1 between (c0, y0) and (c1, y1), in log C; None if it does not."""
    if (y0 - 1) * (y1 - 1) > 0 or y0 == y1:
        return None
    t = (1 - y0) / (y1 - y0)
    return math.exp(math.log(c0) + t * (math.log(c1) - math.log(c0)))


def crossings(pts: list[Point]) -> list[Crossing]:
    out = []
    for a, b in itertools.pairwise(pts):
        at = _cross(a.concurrency, a.ratio, b.concurrency, b.ratio)
        if at is None:
            continue
        rising = b.ratio > a.ratio
        # the optimistic bound crosses first when rising, the pessimistic one last
        early = _cross(a.concurrency, a.high if rising else a.low,
                       b.concurrency, b.high if rising else b.low)
        late = _cross(a.concurrency, a.low if rising else a.high,
                      b.concurrency, b.low if rising else b.high)
        lo = early if early is not None else float(a.concurrency)
        hi = late if late is not None else float(b.concurrency)
        out.append(Crossing(rising, at, min(lo, at), max(hi, at), (a.concurrency, b.concurrency)))
    return out


def _c(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def _topk1(res: GateResult) -> bool:
    k = res.host.get("sglang.speculative_eagle_topk") or res.host.get("sim.topk")
    return k == "1" or "topk1" in res.name.lower()


def policy(name: str, spec: GateResult, ref_name: str, ref: GateResult) -> str | None:
    """One paragraph: crossover(s) with uncertainty, what to run where, traffic, built-in."""
    pts = points(spec, ref)
    if len(pts) < 2:
        return None
    figures = ", ".join(f"C={p.concurrency} {(p.ratio - 1) * 100:+.1f}% "
                        f"[{(p.low - 1) * 100:+.1f}, {(p.high - 1) * 100:+.1f}]" for p in pts)
    cs = crossings(pts)
    parts = [f"**Speculation policy, {name} vs {ref_name}** ({figures}):"]
    if not cs:
        wins = pts[0].ratio >= 1
        span = f"C={pts[0].concurrency}..{pts[-1].concurrency}"
        parts.append(f"{name if wins else ref_name} is faster at every measured level ({span}); "
                     f"run {name if wins else ref_name} throughout.")
    for c in cs:
        a, b = c.between
        where = (f"crosses over at C≈{_c(c.at)} (range {_c(c.low)}–{_c(c.high)} from the CIs, "
                 f"between measured C={a} and C={b})")
        cut = max(1, round(c.at))
        if c.rising:
            parts.append(f"{where}: run {ref_name} below C={cut}, {name} from C={cut}.")
        else:
            parts.append(f"{where}: {name} stops paying; run {ref_name} from C={cut}.")
    tr = spec.traffic
    if tr is not None and spec.baseline_name == ref_name:
        mix = ", ".join(f"C={c} {w:.0%}" for c, w in sorted(tr.weights.items()))
        winner = name if tr.ci_low > 0 else ref_name if tr.ci_high < 0 else "neither (within noise)"
        parts.append(f"On the measured traffic ({mix}) {name} changes output throughput by "
                     f"{tr.change:+.1%} (CI {tr.ci_low:+.1%}..{tr.ci_high:+.1%}): {winner} wins overall.")
    if cs and _topk1(spec):
        parts.append("sglang has a built-in for switching by load: `--speculative-adaptive` "
                     "(EAGLE/EAGLE3, topk 1) changes draft steps by batch size; offer it as a "
                     f"variant (`{name}-adaptive`) and gate it the same way.")
    return " ".join(parts)
