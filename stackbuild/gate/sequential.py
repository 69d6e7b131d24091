"""The gate's sequential test: group-sequential t-tests with Lan-DeMets O'Brien-Fleming spending.

A level is looked at after each run from the profile's `runs` to its `max_runs`. At every
look two one-sided tests of the log ratio mu = log(candidate / incumbent) against the bar
run on the same statistic:

  pass  rejects H0: mu <= log(bar) at level alpha_pass  (false pass at the bar <= alpha_pass)
  fail  rejects H0: mu >= log(bar) at level alpha_fail  (false fail at the bar <= alpha_fail)

Each test spends its alpha over the looks with the Lan-DeMets O'Brien-Fleming-type function
alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)), t the information fraction (Lan & DeMets 1983,
Biometrika 70:659-663). The boundaries for a normal statistic with known variance are found
by the recursive numerical integration of Armitage, McPherson & Rowe (1969, J. R. Stat. Soc.
A 132:235-244); with the variance estimated from 2..15 runs the statistic is Student t, so
each look uses the boundary's nominal significance level on the t distribution of its degrees
of freedom (the "significance level approach" for unknown variance, Jennison & Turnbull 2000,
Group Sequential Methods with Applications to Clinical Trials, ch. 3). At 3..15 runs that
approach crosses a little more often than alpha (2.7-2.9% for 2.5%, measured), so each
boundary is then scaled by one factor >= 1 found on seeded simulated null paths (the t
sequence under the null is free of the unknown spread), which makes its size alpha up to
simulation error; with `run_correlation` > 0 the null paths are AR(1). Each side's boundary
is computed as if the other did not stop the test (non-binding), so neither error exceeds
its alpha; bench/gate_calibration.py measures both at the run counts the gate uses.

The statistic is paired when the incumbent runs in alternation with the candidate (run i of
each: d_i = log(cand_i / inc_i), df = n - 1), and a two-sample t with unpooled variances
(Welch's) when the incumbent's runs are stored from an earlier session, on the conservative
min(n, m) - 1 degrees of freedom (Scheffe 1970, J. Amer. Statist. Assoc. 65:1501-1508);
then the session-to-session drift (a standard deviation on the log scale) is added to the
variance as a known component.

The interval reported at a look, [ratio * exp(-c_pass * se), ratio * exp(c_fail * se)], is
the repeated confidence interval of the two tests (Jennison & Turnbull 2000, ch. 9): the
level passes when its low end clears the bar and fails when its high end is below it.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

Decision = Literal["pass", "fail", "undecided"]
_NORMAL = statistics.NormalDist()
# grid points per stage of the numerical integration (odd, for Simpson's rule)
_GRID = 241


# --- Student t ------------------------------------------------------------------------------

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


def t_isf(p: float, df: float) -> float:
    """The t with P(T > t) = p, for 0 < p < 0.5."""
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


# --- the spending function and its boundaries ------------------------------------------------

def obf_spent(frac: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type: the one-sided alpha spent by information fraction t."""
    if frac <= 0:
        return 0.0
    return min(alpha, 2.0 * (1.0 - _NORMAL.cdf(_NORMAL.inv_cdf(1.0 - alpha / 2.0) / math.sqrt(frac))))


def _q(x: float) -> float:
    return 0.5 * math.erfc(x / math.sqrt(2.0))


def _simpson(n: int) -> list[float]:
    return [1.0 if i in (0, n - 1) else 4.0 if i % 2 else 2.0 for i in range(n)]


def _crossing(b: float, t: float, sd: float, mass: list[float], grid: list[float]) -> float:
    """P(first crossing of boundary b at information t): from the carried sub-density (mass
    at grid points), or P(Z > b) at the first look (no mass carried)."""
    if not grid:
        return _q(b)
    edge = b * math.sqrt(t)
    return sum(m * _q((edge - s) / sd) for m, s in zip(mass, grid, strict=True))


@lru_cache(maxsize=256)
def z_boundaries(fracs: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    """One-sided upper boundaries b_k of Z_k = S_k / sqrt(t_k) that spend `alpha` as obf_spent.

    S is standard Brownian motion in information time; the sub-density of S_k on the
    continuation region is carried from look to look on a grid (Simpson's rule).
    """
    out: list[float] = []
    grid: list[float] = []
    dens: list[float] = []
    prev_t, prev_spent = 0.0, 0.0
    wts = _simpson(_GRID)
    for t in fracs:
        target = obf_spent(t, alpha) - prev_spent
        sd = math.sqrt(t - prev_t)
        h = grid[1] - grid[0] if grid else 0.0
        mass = [w * f * h / 3.0 for w, f in zip(wts, dens, strict=True)] if grid else []
        b = 40.0  # nothing to spend at this look: a boundary no statistic reaches
        if target > 1e-15:
            lo, hi = -10.0, 40.0
            for _ in range(80):
                mid = (lo + hi) / 2.0
                if _crossing(mid, t, sd, mass, grid) > target:
                    lo = mid
                else:
                    hi = mid
            b = (lo + hi) / 2.0
            prev_spent += _crossing(b, t, sd, mass, grid)
        out.append(b)
        # the sub-density of S_t on (-inf, b sqrt(t)]
        top, bottom = min(b, 12.0) * math.sqrt(t), -10.0 * math.sqrt(t)
        new_grid = [bottom + (top - bottom) * i / (_GRID - 1) for i in range(_GRID)]
        if not grid:
            new = [math.exp(-s * s / (2 * t)) / math.sqrt(2 * math.pi * t) for s in new_grid]
        else:
            new = []
            reach = 9.0 * sd
            norm = 1.0 / (sd * math.sqrt(2 * math.pi))
            for s in new_grid:
                acc = 0.0
                for m, u in zip(mass, grid, strict=True):
                    z = s - u
                    if -reach < z < reach:
                        acc += m * math.exp(-z * z / (2 * sd * sd))
                new.append(acc * norm)
        grid, dens, prev_t = new_grid, new, t
    return tuple(out)


def nominal_levels(fracs: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    """The nominal one-sided significance level at each look: P(Z > b_k)."""
    return tuple(_q(b) for b in z_boundaries(fracs, alpha))


# --- the test at one look --------------------------------------------------------------------

@dataclass(frozen=True)
class Design:
    """How a level is tested: paired or against stored runs, its looks, its alphas."""

    paired: bool
    first: int  # the first look: after this many candidate runs
    last: int  # the last look (max_runs)
    alpha_pass: float = 0.025
    alpha_fail: float = 0.025  # per level: the family's alpha over the required levels
    drift: float = 0.0  # session-to-session drift (log-scale sd), stored baselines only
    # lag-1 autocorrelation of a side's successive runs the boundary allows for (AR(1));
    # 0: runs independent
    correlation: float = 0.0

    def looks(self) -> range:
        return range(self.first, self.last + 1)

    def fractions(self, stored_runs: int) -> tuple[float, ...]:
        """Information fraction at each look, n = first..last."""
        def info(n: int) -> float:
            return float(n) if self.paired else 1.0 / (1.0 / n + 1.0 / max(1, stored_runs))

        full = info(self.last)
        return tuple(info(n) / full for n in self.looks())

    def df(self, n: int, stored_runs: int) -> int:
        """Degrees of freedom at n candidate runs: n - 1 paired; stored: min(n, m) - 1 (the
        conservative choice for Welch's statistic, Scheffe 1970), n - 1 with one stored run."""
        if self.paired or stored_runs < 2:
            return n - 1
        return min(n, stored_runs) - 1

    def critical(self, n: int, stored_runs: int) -> tuple[float, float]:
        """(c_pass, c_fail): the t critical values at the look after n candidate runs."""
        stored_runs = 0 if self.paired else stored_runs  # paired: one boundary whatever the count
        k = min(max(n, self.first), self.last) - self.first
        return (_criticals(self, stored_runs, self.alpha_pass, 1)[k],
                _criticals(self, stored_runs, self.alpha_fail, -1)[k])


def _nominal_t(design: Design, stored_runs: int, alpha: float) -> tuple[float, ...]:
    levels = nominal_levels(design.fractions(stored_runs), alpha)
    return tuple(t_isf(max(p, 1e-300), max(1, design.df(n, stored_runs)))
                 for p, n in zip(levels, design.looks(), strict=True))


# Paths of the null simulation that sizes each boundary (see _criticals).
CALIBRATION_PATHS = 40000


def _ar1(rng: random.Random, n: int, rho: float) -> list[float]:
    """n standard normal draws, each correlated rho with the one before (stationary AR(1))."""
    out, e, keep = [], rng.gauss(0.0, 1.0), math.sqrt(1.0 - rho * rho)
    for _ in range(n):
        out.append(e)
        e = rho * e + keep * rng.gauss(0.0, 1.0)
    return out


@lru_cache(maxsize=16)
def _null_paths(paired: bool, first: int, last: int, stored_runs: int,
                rho: float = 0.0) -> tuple[tuple[float, ...], ...]:
    """The t statistic at each look (n = first..last) of seeded simulated runs under the null
    (the true ratio on the bar), for paired or stored runs at equal spreads, the runs of each
    side autocorrelated rho (the paired differences then are too)."""
    rng = random.Random(f"{first}:{last}:{stored_runs}:{paired}:{rho}")
    m = max(1, stored_runs)
    paths = []
    for _ in range(CALIBRATION_PATHS):
        base_mean, base_var = 0.0, -1.0
        if not paired:
            base_mean, base_var = _mean_var(_ar1(rng, m, rho))
            base_var = base_var if m >= 2 else -1.0
        s = ss = 0.0
        ts = []
        for n, x in enumerate(_ar1(rng, last, rho), start=1):
            s += x
            ss += x * x
            if n < first:
                continue
            var = (ss - s * s / n) / (n - 1)
            vb = var if base_var < 0 else base_var
            se = math.sqrt(var / n) if paired else math.sqrt(var / n + vb / m)
            ts.append(((s / n) - base_mean) / se if se > 0 else 0.0)
        paths.append(tuple(ts))
    return tuple(paths)


@lru_cache(maxsize=64)
def _criticals(design: Design, stored_runs: int, alpha: float, side: int = 1) -> tuple[float, ...]:
    """The t boundary at each look: the nominal levels on t, scaled up just enough that the
    probability of ever crossing is alpha (side +1: the pass test's upper boundary; -1: the
    fail test's lower one, on the same simulated paths mirrored).

    Why the scaling: at 3..15 runs the t statistics of successive looks share their variance
    estimate, and the significance-level approach then crosses a little more often than
    alpha (2.7-2.9% for a nominal 2.5%, measured). Under the null the sequence of t
    statistics has a distribution free of the unknown spread (paired: exactly; stored:
    at equal spreads, where the drift-free part needs the widest boundary), so one factor
    lambda >= 1, the (1 - alpha) quantile of max_k T_k / c_k over seeded simulated null
    paths, makes the size exact up to simulation error (sd ~0.0008 at 40 000 paths). A
    factor below 1 is never used: the boundary is only ever widened.
    """
    nominal = _nominal_t(design, stored_runs, alpha)
    if design.df(design.first, stored_runs) < 1:
        return nominal
    # with correlated runs the boundary is sized on AR(1) paths; the nominal t levels stay the
    # starting point and the factor lambda carries the whole correction
    paths = _null_paths(design.paired, design.first, design.last, stored_runs, design.correlation)
    worst = sorted(max(side * t / c for t, c in zip(ts, nominal, strict=True)) for ts in paths)
    lam = worst[min(len(worst) - 1, math.ceil((1.0 - alpha) * len(worst)))]
    return tuple(c * max(1.0, lam) for c in nominal)


@dataclass(frozen=True)
class Look:
    ratio: float  # exp(estimate of mu): the geometric-mean ratio
    low: float  # repeated confidence bounds of the ratio at this look
    high: float
    decision: Decision
    n: int  # candidate runs
    df: float
    se: float  # standard error of the log ratio


def _mean_var(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample variance (0 for one value); floats, not statistics' exact fractions."""
    n = len(xs)
    mean = sum(xs) / n
    return mean, (sum((x - mean) * (x - mean) for x in xs) / (n - 1) if n > 1 else 0.0)


def estimate(cand: Sequence[float], inc: Sequence[float], design: Design) -> tuple[float, float, float]:
    """(mean log ratio, its standard error, degrees of freedom); se nan below 2 runs."""
    lc = [math.log(x) for x in cand]
    li = [math.log(x) for x in inc]
    if design.paired:
        n = min(len(lc), len(li))
        mean, var = _mean_var([a - b for a, b in zip(lc[:n], li[:n], strict=True)])
        return mean, math.sqrt(var / n) if n >= 2 else math.nan, float(design.df(n, 0))
    nc, ni = len(lc), len(li)
    (mc, vc), (mi, vi) = _mean_var(lc), _mean_var(li)
    if nc < 2:
        return mc - mi, math.nan, 0.0
    vi = vi if ni >= 2 else vc  # one stored run: assume equal spreads
    return mc - mi, math.sqrt(vc / nc + vi / ni + design.drift ** 2), float(design.df(nc, ni))


def look(cand: Sequence[float], inc: Sequence[float], bar: float, design: Design) -> Look:
    """The two tests at the look after len(cand) candidate runs."""
    if not cand or not inc:
        raise ValueError("both sides need at least one run")
    if min(cand) <= 0 or min(inc) <= 0:
        raise ValueError("a run measured 0 tok/s")
    est, se, df = estimate(cand, inc, design)
    ratio, edge = math.exp(est), math.log(bar)
    if math.isnan(se) or df <= 0:
        return Look(ratio, 0.0, math.inf, "undecided", len(cand), df, math.inf)
    if se == 0.0:
        decision: Decision = "pass" if est > edge else "fail" if est < edge else "undecided"
        return Look(ratio, ratio, ratio, decision, len(cand), df, 0.0)
    c_pass, c_fail = design.critical(len(cand), len(inc))
    low, high = math.exp(est - c_pass * se), math.exp(est + c_fail * se)
    decision = "pass" if low >= bar else "fail" if high < bar else "undecided"
    return Look(ratio, low, high, decision, len(cand), df, se)
