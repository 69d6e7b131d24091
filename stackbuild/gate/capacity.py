"""Capacity under an SLO: the highest concurrency at which every SLO holds, and goodput there.

A binary search over a geometric grid of concurrency levels (not a fixed sweep):
one run per probed level, at most ceil(log2(len(grid))) + 1 runs a side. It assumes
latency grows with concurrency, which holds for a continuous-batching server below
its KV limit. Goodput is the output tok/s of the requests that met every SLO
themselves (their own TTFT, their own p99 inter-token gap and TPOT).

`parse_slo`, `violations`, `goodput` and `search` are pure (search takes the
measurement as a function); `measure_capacity` runs it over HTTP.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from stackbuild.gate import loadgen
from stackbuild.gate.result import CapacityResult, RunMetrics, Workload
from stackbuild.gate.stats import percentile
from stackbuild.spec.profile import SLO_KEYS

# each level 1.33-1.5x the last: "one step" of the search
GRID: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def parse_slo(text: str) -> dict[str, float]:
    """`ttft_p99_ms=2000,itl_p99_ms=50` -> dict; ValueError with what is accepted."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, val = part.partition("=")
        try:
            num = float(val)
        except ValueError:
            num = -1.0
        if not sep or key not in SLO_KEYS or not num > 0:
            raise ValueError(f"{part!r} is not KEY=MS with KEY one of {', '.join(SLO_KEYS)} "
                             "and MS > 0, e.g. ttft_p99_ms=2000,itl_p99_ms=50")
        out[key] = num
    if not out:
        raise ValueError("no SLO given, e.g. ttft_p99_ms=2000,itl_p99_ms=50")
    return out


def violations(run: RunMetrics, slo: dict[str, float]) -> list[str]:
    got = {"ttft_p99_ms": run.ttft_ms.p99, "itl_p99_ms": run.itl_ms.p99,
           "tpot_p99_ms": run.tpot_ms.p99}
    out = [f"{k} {got[k]:.1f} > {v:g}" for k, v in slo.items() if got[k] > v]
    if run.failed:
        out.append(f"{run.failed} failed requests")
    return out


def request_meets(rec: loadgen.RequestRecord, slo: dict[str, float]) -> bool:
    if not rec.ok or rec.ttft is None:
        return False
    gaps = [(b - a) * 1000 for a, b in zip(rec.chunk_times, rec.chunk_times[1:], strict=False)]
    own = {"ttft_p99_ms": rec.ttft * 1000, "itl_p99_ms": percentile(gaps, 99),
           "tpot_p99_ms": ((rec.end - rec.start - rec.ttft) * 1000 / (rec.output_tokens - 1)
                           if rec.output_tokens > 1 else 0.0)}
    return all(own[k] <= v for k, v in slo.items())


def goodput(records: list[loadgen.RequestRecord], slo: dict[str, float], duration: float) -> float:
    if duration <= 0:
        return 0.0
    return sum(r.output_tokens for r in records if request_meets(r, slo)) / duration


Probe = tuple[RunMetrics, float]  # a run and its goodput


async def search(measure: Callable[[int], Awaitable[Probe]], slo: dict[str, float],
                 max_concurrency: int) -> CapacityResult:
    grid = [c for c in GRID if c <= max_concurrency] or [1]
    seen: dict[int, tuple[Probe, list[str]]] = {}

    async def holds(i: int) -> bool:
        c = grid[i]
        if c not in seen:
            probe = await measure(c)
            seen[c] = (probe, violations(probe[0], slo))
        return not seen[c][1]

    lo, hi = -1, len(grid)  # grid[lo] holds (or none), grid[hi] does not (or beyond)
    if await holds(0):
        lo = 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if await holds(mid):
                lo = mid
            else:
                hi = mid
    tried = tuple(f"C={c}: " + ("; ".join(v) or "holds") for c, (_, v) in sorted(seen.items()))
    if lo < 0:
        return CapacityResult(slo=slo, concurrency=0, runs=len(seen), tried=tried)
    (run, good), _ = seen[grid[lo]]
    return CapacityResult(
        slo=slo, concurrency=grid[lo], goodput_tok_s=good, output_tok_s=run.output_tok_s,
        ttft_p99_ms=run.ttft_ms.p99, itl_p99_ms=run.itl_ms.p99, tpot_p99_ms=run.tpot_ms.p99,
        next_concurrency=grid[hi] if hi < len(grid) else None, runs=len(seen), tried=tried)


async def measure_capacity(url: str, wl: Workload, slo: dict[str, float],
                           max_concurrency: int) -> CapacityResult:
    async def measure(c: int) -> Probe:
        records: list[loadgen.RequestRecord] = []
        run = await loadgen.run_once(url, wl, c, 0, on_done=records.append)
        return run, goodput(records, slo, run.duration_s)

    return await search(measure, slo, max_concurrency)
