"""Capacity under an SLO: the highest concurrency at which every SLO holds, with an interval.

A binary search over a geometric grid of concurrency levels (not a fixed sweep): one run
per probed level, at least `capacity_min_requests` requests, at most
ceil(log2(len(grid))) + 1 runs a side. It assumes latency grows with concurrency, which
holds for a continuous-batching server below its KV limit.

Each probed level's p99s get an interval at the gate's confidence. TTFT and TPOT, one value
per request: the distribution-free order-statistic interval of a quantile (x_(l), x_(u)
with l, u from the binomial distribution of how many requests fall below the true p99;
Hahn & Meeker 1991, Statistical Intervals, ch. 5.2); below `P99_UPPER_MIN` requests no
order statistic bounds the p99 from above at 97.5% and its upper end is infinite (the
sample maximum is not a bound: with 32 requests it is below the true p99 28% of the
time). ITL over every gap (a request's gaps are not independent): a bootstrap interval
over requests (resampled with replacement, a request's gaps with it; Efron & Tibshirani
1993, ch. 13), its 99th percentile taken over thousands of gaps.
The search follows the point estimates; the capacity's interval is
  low:  the highest probed level where every SLO holds at the upper end of its interval
        (by monotonicity every level below holds too),
  high: the level just below the lowest probed level where an SLO is broken at the lower
        end of its interval (the grid's top when none is).
Goodput is the output tok/s of the requests that met every SLO themselves (their own
TTFT, their own p99 inter-token gap and TPOT), with its bootstrap interval over requests.

`parse_slo`, `request_values`, `judge_step` and `search` are pure (search takes the
measurement as a function); `measure_capacity` runs it over HTTP.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from stackbuild.gate import loadgen
from stackbuild.gate.result import CapacityResult, RunMetrics, Workload
from stackbuild.gate.stats import percentile
from stackbuild.spec.profile import SLO_KEYS

# each level 1.33-1.5x the last: "one step" of the search
GRID: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
RESAMPLES = 400
Q = 0.99
# the fewest requests whose largest order statistic bounds the p99 from above at 97.5%:
# 1 - 0.99^n >= 0.975
P99_UPPER_MIN = 367
# the SLO metrics measured once per request (order-statistic intervals); the rest: bootstrap
PER_REQUEST = ("ttft_p99_ms", "tpot_p99_ms")


def binom_cdf(k: int, n: int, q: float) -> float:
    """P(Binomial(n, q) <= k)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    lq, lp = math.log(q), math.log1p(-q)
    head = math.lgamma(n + 1)
    return min(1.0, sum(math.exp(head - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                                 + i * lq + (n - i) * lp) for i in range(k + 1)))


def quantile_interval(xs: Sequence[float], q: float = Q,
                      confidence: float = 0.95) -> tuple[float, float, float]:
    """(nearest-rank point, low, high) of the q-quantile of i.i.d. values: the order statistics
    x_(l) <= xi_q <= x_(u), each side missing with probability at most (1 - confidence) / 2;
    0.0 low / inf high where no order statistic reaches that confidence."""
    s = sorted(xs)
    n = len(s)
    if not n:
        return 0.0, 0.0, 0.0
    tail = (1.0 - confidence) / 2.0
    point = s[min(n - 1, max(0, math.ceil(round(q * n, 9)) - 1))]
    # upper: the smallest u with P(x_(u) >= xi_q) = P(B <= u - 1) >= 1 - tail
    up = next((u for u in range(1, n + 1) if binom_cdf(u - 1, n, q) >= 1.0 - tail), None)
    # lower: the largest l with P(x_(l) <= xi_q) = P(B >= l) = 1 - P(B <= l - 1) >= 1 - tail
    lo = next((l_ for l_ in range(n, 0, -1) if 1.0 - binom_cdf(l_ - 1, n, q) >= 1.0 - tail), None)
    return point, s[lo - 1] if lo else 0.0, s[up - 1] if up else float("inf")


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


def _gaps_ms(rec: loadgen.RequestRecord) -> list[float]:
    return [(b - a) * 1000 for a, b in zip(rec.chunk_times, rec.chunk_times[1:], strict=False)]


def request_values(rec: loadgen.RequestRecord) -> dict[str, list[float]]:
    """A completed request's own samples of each SLO metric (ms): one TTFT, one TPOT, its gaps."""
    tpot = ((rec.end - rec.start - (rec.ttft or 0.0)) * 1000 / (rec.output_tokens - 1)
            if rec.output_tokens > 1 else 0.0)
    return {"ttft_p99_ms": [(rec.ttft or 0.0) * 1000], "itl_p99_ms": _gaps_ms(rec),
            "tpot_p99_ms": [tpot]}


def request_meets(rec: loadgen.RequestRecord, slo: dict[str, float]) -> bool:
    if not rec.ok or rec.ttft is None:
        return False
    own = request_values(rec)
    own["itl_p99_ms"] = [percentile(own["itl_p99_ms"], 99)]
    return all(own[k][0] <= v for k, v in slo.items())


def goodput(records: list[loadgen.RequestRecord], slo: dict[str, float], duration: float) -> float:
    if duration <= 0:
        return 0.0
    return sum(r.output_tokens for r in records if request_meets(r, slo)) / duration


class _Tail:
    """The upper tail of one metric over requests: its p99 under any resampling weights."""

    def __init__(self, per_request: Sequence[Sequence[float]]) -> None:
        self.counts = [len(v) for v in per_request]
        flat = sorted(((x, i) for i, vs in enumerate(per_request) for x in vs), reverse=True)
        self.flat = flat

    def quantile(self, weights: Sequence[int]) -> float:
        """Nearest-rank q-quantile of the samples, each request counted weights[i] times."""
        total = sum(w * n for w, n in zip(weights, self.counts, strict=True))
        if total == 0:
            return 0.0
        need, acc = (1.0 - Q) * total, 0.0
        for x, i in self.flat:
            acc += weights[i]
            if acc >= need:
                return x
        return self.flat[-1][0]


@dataclass(frozen=True)
class Step:
    """One probed level: the point p99s and their intervals, judged against the SLOs."""

    concurrency: int
    run: RunMetrics
    p99: dict[str, tuple[float, float, float]]  # key -> (point, low, high)
    goodput: tuple[float, float, float]  # (point, low, high) tok/s
    holds: bool  # by the point estimates (and no failed request)
    surely_holds: bool  # at the upper ends of the intervals
    surely_broken: bool  # at the lower end of some interval, or a failed request

    def said(self, slo: dict[str, float]) -> str:
        bad = [f"{k} {self.p99[k][0]:.1f} > {v:g}" for k, v in slo.items() if self.p99[k][0] > v]
        if self.run.failed:
            bad.append(f"{self.run.failed} failed requests")
        return f"C={self.concurrency}: " + ("; ".join(bad) or "holds")


def judge_step(c: int, run: RunMetrics, records: list[loadgen.RequestRecord],
               slo: dict[str, float], *, confidence: float = 0.95, seed: int = 0) -> Step:
    """The step's p99s and goodput with their bootstrap intervals over requests."""
    ok = [r for r in records if r.ok and r.ttft is not None]
    values = [request_values(r) for r in ok]
    tails = {k: _Tail([v[k] for v in values]) for k in slo}
    meets = [r.output_tokens if request_meets(r, slo) else 0 for r in ok]
    dur = run.duration_s
    ones = [1] * len(ok)
    point = {k: t.quantile(ones) for k, t in tails.items()}
    good = sum(meets) / dur if dur > 0 else 0.0
    rng = random.Random(f"capacity:{seed}:{c}")
    draws: dict[str, list[float]] = {k: [] for k in slo}
    goods: list[float] = []
    for _ in range(RESAMPLES if ok else 0):
        w = [0] * len(ok)
        for _ in ok:
            w[rng.randrange(len(ok))] += 1
        for k, t in tails.items():
            draws[k].append(t.quantile(w))
        goods.append(sum(wi * m for wi, m in zip(w, meets, strict=True)) / dur if dur > 0 else 0.0)
    a = 100 * (1.0 - confidence) / 2.0

    def interval(xs: list[float], at: float) -> tuple[float, float, float]:
        return (at, percentile(xs, a), percentile(xs, 100 - a)) if xs else (at, at, at)

    p99 = {k: (point[k], *quantile_interval([v[k][0] for v in values], Q, confidence)[1:])
           if k in PER_REQUEST else interval(draws[k], point[k]) for k in slo}
    failed = run.failed > 0 or not ok
    return Step(
        concurrency=c, run=run, p99=p99, goodput=interval(goods, good),
        holds=not failed and all(p99[k][0] <= v for k, v in slo.items()),
        surely_holds=not failed and all(p99[k][2] <= v for k, v in slo.items()),
        surely_broken=failed or any(p99[k][1] > v for k, v in slo.items()),
    )


Measure = Callable[[int], Awaitable[tuple[RunMetrics, list[loadgen.RequestRecord]]]]


async def search(measure: Measure, slo: dict[str, float], max_concurrency: int, *,
                 confidence: float = 0.95, seed: int = 0) -> CapacityResult:
    grid = [c for c in GRID if c <= max_concurrency] or [1]
    seen: dict[int, Step] = {}

    async def holds(i: int) -> bool:
        c = grid[i]
        if c not in seen:
            run, records = await measure(c)
            seen[c] = judge_step(c, run, records, slo, confidence=confidence, seed=seed)
        return seen[c].holds

    lo, hi = -1, len(grid)  # grid[lo] holds (or none), grid[hi] does not (or beyond)
    if await holds(0):
        lo = 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if await holds(mid):
                lo = mid
            else:
                hi = mid
    tried = tuple(s.said(slo) for _, s in sorted(seen.items()))
    sure = [c for c, s in seen.items() if s.surely_holds]
    broken = [c for c, s in seen.items() if s.surely_broken]
    low = max(sure, default=0)
    first_broken = min(broken, default=None)
    high = grid[-1] if first_broken is None else \
        max((c for c in grid if c < first_broken), default=0)
    if lo < 0:
        return CapacityResult(slo=slo, concurrency=0, concurrency_low=0, concurrency_high=high,
                              runs=len(seen), tried=tried)
    step = seen[grid[lo]]
    run = step.run
    return CapacityResult(
        slo=slo, concurrency=grid[lo], concurrency_low=min(low, grid[lo]),
        concurrency_high=max(high, grid[lo]), goodput_tok_s=step.goodput[0],
        goodput_low=step.goodput[1], goodput_high=step.goodput[2],
        output_tok_s=run.output_tok_s, ttft_p99_ms=step.p99.get("ttft_p99_ms", (run.ttft_ms.p99,))[0],
        itl_p99_ms=step.p99.get("itl_p99_ms", (run.itl_ms.p99,))[0],
        tpot_p99_ms=step.p99.get("tpot_p99_ms", (run.tpot_ms.p99,))[0],
        next_concurrency=grid[hi] if hi < len(grid) else None, runs=len(seen), tried=tried)


async def measure_capacity(url: str, wl: Workload, slo: dict[str, float], max_concurrency: int,
                           *, min_requests: int = 0, confidence: float = 0.95) -> CapacityResult:
    wl = wl.model_copy(update={"min_requests": max(wl.min_requests, min_requests)})

    async def measure(c: int) -> tuple[RunMetrics, list[loadgen.RequestRecord]]:
        records: list[loadgen.RequestRecord] = []
        run = await loadgen.run_once(url, wl, c, 0, on_done=records.append)
        return run, records

    return await search(measure, slo, max_concurrency, confidence=confidence, seed=wl.seed)

