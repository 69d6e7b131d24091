"""Traffic: how much of the time a server spends at each concurrency, and the verdict on it.

`stackbuild traffic` samples the incumbent's /metrics (`sglang:num_running_reqs` +
`sglang:num_queue_reqs`: requests in flight) over a window; each busy sample is mapped
to the nearest gate level (in log space, so 5 goes to 8 rather than 1 among [1, 8]).
The shares are the weights of a traffic-weighted verdict: the expected change of
output throughput over time on that traffic, sum(w * cand / inc) - 1 (each level's
ratio weighted by the share of time the server spends there, not by its tok/s), with a
t interval from the levels' log-ratio estimates (delta method; Welch-Satterthwaite
degrees of freedom). With `decide_on: traffic` it is the gate's verdict.

`weights`, `weighted_change` are pure (`parse_metrics`, `in_flight`: effects/prometheus.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from stackbuild.effects.prometheus import in_flight, parse_metrics
from stackbuild.gate.stats import t_isf

__all__ = ["in_flight", "parse_metrics"]  # they live in effects/prometheus.py (the drain counts the same way)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)?$")


def parse_duration(text: str) -> float:
    """`10m`, `30s`, `1h`, `90` (seconds) -> seconds; ValueError otherwise."""
    m = _DURATION.match(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration like 30s, 10m or 1h")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def nearest_level(x: float, levels: Sequence[int]) -> int:
    return min(levels, key=lambda c: (abs(math.log(c) - math.log(max(x, 1.0))), c))


def weights(samples: Sequence[float], levels: Sequence[int]) -> tuple[dict[int, float], float]:
    """(level -> share of busy samples, idle share). No busy samples: ({}, 1.0)."""
    if not samples:
        return {}, 1.0
    busy = [s for s in samples if s > 0]
    counts = {c: 0 for c in levels}
    for s in busy:
        counts[nearest_level(s, levels)] += 1
    idle = 1.0 - len(busy) / len(samples)
    if not busy:
        return {}, idle
    return {c: n / len(busy) for c, n in counts.items() if n}, idle


def weighted_change(
    per_level: Mapping[int, tuple[float, float, float]],
    w: Mapping[int, float],
    *,
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """(change, low, high) of sum(w * ratio) - 1 over the weighted levels that were measured.

    `per_level`: level -> (log-ratio estimate, its standard error, degrees of freedom), as
    stackbuild.gate.sequential.estimate gives them. The interval is two-sided at `confidence`.
    """
    levels = [c for c in w if c in per_level and w[c] > 0]
    if not levels:
        raise ValueError("no measured level carries traffic weight")
    total = sum(w[c] for c in levels)
    terms = [(w[c] / total * math.exp(per_level[c][0]), per_level[c][1], per_level[c][2])
             for c in levels]
    change = sum(r for r, _, _ in terms) - 1.0
    parts = [(r * se) ** 2 for r, se, _ in terms]
    var = sum(parts)
    if var == 0:
        return change, change, change
    if any(math.isnan(p) or df <= 0 for p, (_, _, df) in zip(parts, terms, strict=True)):
        return change, -math.inf, math.inf
    denom = sum(p * p / df for p, (_, _, df) in zip(parts, terms, strict=True) if math.isfinite(df))
    df = var * var / denom if denom > 0 else math.inf
    half = t_isf((1.0 - confidence) / 2.0, df) * math.sqrt(var)
    return change, change - half, change + half


async def sample(url: str, seconds: float, every: float) -> list[float]:
    """Requests in flight every `every` s for `seconds` s; InfraError when /metrics has none."""
    import asyncio

    import aiohttp

    from stackbuild.errors import InfraError

    out: list[float] = []
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    async with aiohttp.ClientSession() as s:
        while True:
            try:
                async with s.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
                    text = await r.text()
                    status = r.status
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                raise InfraError(f"GET {url}/metrics failed: {type(err).__name__}: {err}") \
                    from None
            n = in_flight(parse_metrics(text)) if status == 200 else None
            if n is None:
                raise InfraError(f"GET {url}/metrics: HTTP {status}, no sglang:num_running_reqs; "
                                 "start sglang with --enable-metrics")
            out.append(n)
            if loop.time() + every > end:
                return out
            await asyncio.sleep(every)
