"""Pure statistics for the gate: percentiles, a bootstrap CI of a ratio of medians (the
report's speculation policy), a level's policy in words, and Student's t (its tail and
inverse, for the sequential test's boundaries). The gate's decision is
stackbuild.gate.sequential."""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Sequence

from stackbuild.gate.result import Percentiles

BOOTSTRAP_RESAMPLES = 4000
_NORMAL = statistics.NormalDist()


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); 0.0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def percentiles(values: Sequence[float]) -> Percentiles:
    if not values:
        return Percentiles()
    return Percentiles(
        mean=statistics.fmean(values),
        p50=percentile(values, 50),
        p90=percentile(values, 90),
        p99=percentile(values, 99),
    )


def bootstrap_ratio_ci(
    candidate: Sequence[float],
    incumbent: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(ratio, low, high): median(candidate)/median(incumbent) with a percentile bootstrap CI.

    The two samples are resampled independently (runs are independent measurements).
    """
    if not candidate or not incumbent:
        raise ValueError("both samples need at least one run")
    inc_med = statistics.median(incumbent)
    if inc_med <= 0:
        raise ValueError("the incumbent's median throughput is zero")
    ratio = statistics.median(candidate) / inc_med
    rng = random.Random(seed)
    nc, ni = len(candidate), len(incumbent)
    ratios: list[float] = []
    for _ in range(resamples):
        c = statistics.median([candidate[rng.randrange(nc)] for _ in range(nc)])
        i = statistics.median([incumbent[rng.randrange(ni)] for _ in range(ni)])
        ratios.append(c / i if i > 0 else float("inf"))
    alpha = (1.0 - confidence) / 2.0
    return ratio, percentile(ratios, 100 * alpha), percentile(ratios, 100 * (1 - alpha))


def allowed(bar: float, margin: float = 0.0) -> str:
    """The policy of a level in words: "allowed -8%", "must not lose (margin 2%)", "required +5%"."""
    if margin > 0 and abs(bar - (1.0 - margin)) < 1e-9:
        return f"must not lose (margin {margin * 100:g}%)"
    if abs(bar - 1.0) < 1e-9:
        return "must not lose"
    if bar < 1.0:
        return f"allowed -{(1 - bar) * 100:g}%"
    return f"required +{(bar - 1) * 100:g}%"


# --- Student t (the sequential test's, stackbuild.gate.sequential) -----------------------------

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((a + m2 - 1) * (a + m2)),
                    -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
          + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(ln) * _betacf(a, b, x) / a
    return 1.0 - math.exp(ln) * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom (df = inf: the normal)."""
    if math.isinf(df):
        return 1.0 - _NORMAL.cdf(t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@functools.lru_cache(maxsize=4096)
def t_isf(p: float, df: float) -> float:
    """The t with P(T > t) = p, for 0 < p < 0.5. Cached: a pure function of two numbers that the trend test
    and the boundaries ask for with the same few (level, df) at every look, and each answer is a bisection of
    up to 200 incomplete-beta evaluations (`gate --plan`'s 400 simulated gates spent 6 of its 10 s here)."""
    if not 0.0 < p < 0.5:
        raise ValueError(f"t_isf needs 0 < p < 0.5, got {p}")
    if math.isinf(df):
        return _NORMAL.inv_cdf(1.0 - p)
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > p:
        lo, hi = hi, hi * 4.0
    for _ in range(200):  # bisection in log space: the far tail at df 1-2 reaches 1e6
        mid = math.sqrt(lo * hi) if lo > 0 else hi / 2.0
        if t_sf(mid, df) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-10 * hi:
            break
    return (lo + hi) / 2.0
