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

On a swap the incumbent is measured right before it is stopped, in mirror order (its run i
i + 1/2 runs before the switch, the candidate's i + 1/2 after: decide.reference_order); where
the profile declares `within_gate_drift: linear` (decide.detrends), or by default (auto) where
the pairs trend with their separation (`resolved`), it is `detrended`: the analysis of
covariance of d_i on the pair's separation (Cochran 1957, Biometrics 13:261-281), its
intercept the difference with the two runs measured at once, on n - 2 degrees of freedom; a
linear drift of the machine shared by both sides no longer reads as a difference. Compared
plain under auto, its variance allows for a machine that wanders at random (`within_gate_walk`,
trend.walk_variance). Each is sized on null paths of its own statistic (walked and not).

The interval reported at a look, [ratio * exp(-c_pass * se), ratio * exp(c_fail * se)], is
the repeated confidence interval of the two tests (Jennison & Turnbull 2000, ch. 9): the
level passes when its low end clears the bar and fails when its high end is below it.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

import numpy as np

from stackbuild.gate import trend
from stackbuild.gate.nullsim import ar1_rows, trimmed_rows
from stackbuild.gate.stats import t_isf
from stackbuild.gate.trend import detrended, detrended_rows, mirror_separations, trends

Decision = Literal["pass", "fail", "undecided"]
_NORMAL = statistics.NormalDist()
# grid points per stage of the numerical integration (odd, for Simpson's rule)
_GRID = 241


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
    # paired runs of a swap, the incumbent's measured in mirror order right before the
    # candidate's (decide.reference_order), opted in by within_gate_drift: linear
    # (decide.detrends): the statistic is `detrended`
    detrend: bool = False
    # within_gate_drift "auto" (the default) on such a swap: the plain statistic, unless the
    # paired differences trend with their separation (the slope's two-sided t test at this
    # level, Bancroft 1944's preliminary test): then the detrended one, on its own boundary
    trend_test: float = 0.0
    # runs' time of restart between the incumbent's last run and the candidate's first (the
    # swap's gap): the pairs' separations include it, so a drift through it is extrapolated
    gap: int = 0
    # "auto" on such a swap, compared plain: its variance allows for a machine wandering at
    # random by this ratio of a pair's own variance a run (within_gate_walk, trend.walk_variance)
    walk: float = 0.0

    def looks(self) -> range:
        return range(self.first, self.last + 1)

    def fractions(self, stored_runs: int) -> tuple[float, ...]:
        """Information fraction at each look, n = first..last."""
        def info(n: int) -> float:
            if self.detrend:  # 1 / var of the intercept at separation 0, in units of sigma^2
                return n * (n * n - 1.0) / (4.0 * n * n - 1.0)
            return float(n) if self.paired else 1.0 / (1.0 / n + 1.0 / max(1, stored_runs))

        full = info(self.last)
        return tuple(info(n) / full for n in self.looks())

    def df(self, n: int, stored_runs: int) -> int:
        """Degrees of freedom at n candidate runs of the trimmed statistic: n - 2g - 1 paired
        (g = trim_count(n)); stored: min(h_c, h_i) - 1, h = n - 2g each side (the conservative
        choice for Welch's and Yuen's statistic, Scheffe 1970), h_c - 1 with one stored run;
        detrended: n - 2 (a slope estimated besides the mean, no trimming)."""
        if self.detrend:
            return n - 2
        h = n - 2 * trim_count(n)
        if self.paired or stored_runs < 2:
            return h - 1
        return min(h, stored_runs - 2 * trim_count(stored_runs)) - 1

    def start(self, stored_runs: int = 0) -> Design:
        """This design looking only from the first run count where its boundary can be crossed
        (a t boundary at most REACHABLE_T), the alpha spent over the looks that remain."""
        return _start(self, stored_runs)

    def critical(self, n: int, stored_runs: int) -> tuple[float, float]:
        """(c_pass, c_fail): the t critical values at the look after n candidate runs."""
        stored_runs = 0 if self.paired else stored_runs  # paired: one boundary whatever the count
        k = min(max(n, self.first), self.last) - self.first
        return (_criticals(self, stored_runs, self.alpha_pass, 1)[k],
                _criticals(self, stored_runs, self.alpha_fail, -1)[k])


@lru_cache(maxsize=512)  # a pure function of its arguments, asked for by every trial of the harness
def _start(design: Design, stored_runs: int) -> Design:
    d = design
    while d.first < d.last and d.df(d.first, stored_runs) >= 1 and \
            _nominal_t(d, 0 if d.paired else stored_runs, min(d.alpha_pass, d.alpha_fail))[0] \
            > REACHABLE_T:
        d = replace(d, first=d.first + 1)
    return d


@lru_cache(maxsize=512)  # every trial of the harness and every look of a gate asks again (Design.start)
def _nominal_t(design: Design, stored_runs: int, alpha: float) -> tuple[float, ...]:
    levels = nominal_levels(design.fractions(stored_runs), alpha)
    return tuple(t_isf(max(p, 1e-300), max(1, design.df(n, stored_runs)))
                 for p, n in zip(levels, design.looks(), strict=True))


# Paths of the null simulation that sizes each boundary (see _criticals).
CALIBRATION_PATHS = 40000
# a look whose t boundary exceeds this cannot be crossed by runs a server really gives (at
# 3 runs and 2 df the first O'Brien-Fleming boundary is ~10^3): the design starts looking
# only from the first run count whose boundary is below it (see Design.start)
REACHABLE_T = 12.0


def trim_count(n: int) -> int:
    """Runs trimmed from each end at n: none below 10 (a trimmed run costs two degrees of
    freedom, dear at a few runs), then one per 10."""
    return n // 10


def robust(xs: Sequence[float]) -> tuple[float, float, int]:
    """(trimmed mean, its variance, degrees of freedom) of runs in time order.

    The Tukey-McLaughlin trimmed mean with its winsorized variance (Tukey & McLaughlin 1963,
    Sankhya A 25:331-352; the paired form of Yuen 1974, Biometrika 61:165-170): trimming
    `trim_count(n)` runs from each end, one bad run cannot move the estimate or its spread
    by more than its neighbour does; df = n - 2g - 1. Correlated runs are the boundary's
    business (_criticals sizes it on AR(1) null paths of the declared correlation).
    """
    n = len(xs)
    if n < 2:
        return (xs[0] if xs else 0.0), math.nan, 0
    g = trim_count(n)
    s = sorted(xs)
    core = s[g:n - g]
    est = sum(core) / len(core)
    wins = [s[g]] * g + core + [s[n - g - 1]] * g
    _, vw = _mean_var(wins)
    var = vw / (n * (1.0 - 2.0 * g / n) ** 2)
    return est, var, n - 2 * g - 1


def _seeded(seed: str) -> np.random.Generator:
    """A generator seeded by a design's description: the same paths for the same design, run to run."""
    return np.random.default_rng(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big"))


def _null_draws(paired: bool, last: int, stored_runs: int, rho: float, seed: str) -> tuple[np.ndarray, np.ndarray]:
    """The seeded null simulation's runs: (CALIBRATION_PATHS x last candidate runs, or paired
    differences; CALIBRATION_PATHS x max(1, stored_runs) stored runs, zeros when paired)."""
    rng = _seeded(seed)
    m = max(1, stored_runs)
    xs = ar1_rows(rng, CALIBRATION_PATHS, last, rho)
    return xs, (np.zeros((CALIBRATION_PATHS, m)) if paired else ar1_rows(rng, CALIBRATION_PATHS, m, rho))


@lru_cache(maxsize=16)
def _null_paths(paired: bool, first: int, last: int, stored_runs: int, rho: float = 0.0,
                detrend: bool = False, gap: int = 0, walk: float = 0.0,
                walked: bool = False) -> np.ndarray:
    """The statistic at each look (columns n = first..last) of seeded simulated runs under the
    null (the true ratio on the bar), for paired or stored runs at equal spreads, the runs of
    each side autocorrelated rho (the paired differences then are too); `detrend`: of the
    detrended statistic; `walk`: of the plain statistic allowing for a walk of that ratio
    (trend.walk_variance), the paths `walked` by it or not.

    The draws are `_null_draws`'s (seeded by the design); the statistic is `statistic`'s
    (paired: `robust` or `detrended` of the differences; stored: Yuen's difference of the two
    sides' `robust`, one stored run taken at the candidate's spread), for all paths at once
    (tests/test_gate_stats.py holds the two equal)."""
    seed = f"{first}:{last}:{stored_runs}:{paired}:{rho}" + (f":trend{gap or ''}" if detrend else "")
    xs, base = _null_draws(paired, last, stored_runs, rho, seed)
    if walk and walked:
        seed += f":walk{walk}:{gap}"
        xs = xs + trend.walk_rows(_seeded(seed), len(xs), last, gap, walk)
    m = base.shape[1]
    mi, vi = trimmed_rows(base, trim_count(m)) if m >= 2 and not paired else (base[:, 0], None)
    cols = []
    for n in range(first, last + 1):
        if n < (3 if detrend else 2):
            cols.append(np.zeros(len(xs)))
            continue
        mc, vc = detrended_rows(xs[:, :n], gap) if detrend else trimmed_rows(xs[:, :n], trim_count(n))
        if walk and n >= 3:
            vc = np.maximum(vc, trend.walk_variance_rows(xs[:, :n], gap, walk))
        se = np.sqrt(vc if paired else vc + (vc if vi is None else vi))
        with np.errstate(divide="ignore", invalid="ignore"):
            cols.append(np.where((se > 0) & np.isfinite(se), (mc - mi) / se, 0.0))
    out = np.column_stack(cols)
    out.flags.writeable = False  # shared by the cache
    return out


def _lambda(design: Design, stored_runs: int, alpha: float, side: int,
            nominal: tuple[float, ...], rho: float, walked: bool = False) -> float:
    paths = _null_paths(design.paired, design.first, design.last, stored_runs, rho, design.detrend,
                        design.gap if design.detrend or design.walk else 0, design.walk, walked)
    worst = np.sort((side * paths / np.array(nominal)).max(axis=1))
    return float(worst[min(len(worst) - 1, math.ceil((1.0 - alpha) * len(worst)))])


@lru_cache(maxsize=64)
def _criticals(design: Design, stored_runs: int, alpha: float, side: int = 1) -> tuple[float, ...]:
    """The t boundary at each look: the nominal levels on t, scaled up just enough that the
    probability of ever crossing is alpha (side +1: the pass test's upper boundary; -1: the
    fail test's lower one, on the same simulated paths mirrored).

    Why the scaling: at 3..15 runs the statistics of successive looks share their variance
    estimate, and the trimmed statistic is only approximately t; under the null the sequence
    of statistics has a distribution free of the unknown spread (paired: exactly; stored: at
    equal spreads, where the drift-free part needs the widest boundary), so one factor
    lambda, the (1 - alpha) quantile of max_k T_k / c_k over seeded simulated null paths,
    makes the size alpha up to simulation error (sd ~0.0008 at 40 000 paths). The factor is
    the largest over independent runs and AR(1) runs of lag-1 correlation
    `design.correlation` (the declared worst case), so the size holds for either; allowing
    for a walk (`design.walk`), the largest also over paths with and without that walk.
    """
    nominal = _nominal_t(design, stored_runs, alpha)
    if design.df(design.first, stored_runs) < 1:
        return nominal
    rhos = {0.0, design.correlation}
    walks = (False, True) if design.walk else (False,)
    lam = max(_lambda(design, stored_runs, alpha, side, nominal, r, w)
              for r in sorted(rhos) for w in walks)
    # paired, the statistic's null distribution is free of the spread: lambda is used as found,
    # below 1 too; two-sample it is sized at equal spreads, where the min(n, m) - 1 degrees of
    # freedom are most conservative, so it only ever widens the boundary there
    return tuple(c * (lam if design.paired else max(1.0, lam)) for c in nominal)


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


def resolved(design: Design, cand: Sequence[float], inc: Sequence[float]) -> Design:
    """The design a look uses: a `trend_test` design becomes the detrended one where the paired
    log differences trend with their separations, else the plain one."""
    if not design.trend_test:
        return design
    n = min(len(cand), len(inc))
    diffs = [math.log(a) - math.log(b) for a, b in zip(cand[:n], inc[:n], strict=True)]
    if trends(diffs, mirror_separations(n, design.gap), design.trend_test):
        return replace(design, trend_test=0.0, detrend=True, walk=0.0, first=max(design.first, 3))
    return replace(design, trend_test=0.0, gap=design.gap if design.walk else 0)


def statistic(cand: Sequence[float], inc: Sequence[float],
              design: Design) -> tuple[float, float, float]:
    """(estimate of mu, its standard error, degrees of freedom) from log tok/s in run order.

    Paired (the incumbent's run i on the same seeded prompts as the candidate's run i,
    measured beside it or stored): `robust` of d_i = cand_i - inc_i. Two-sample: Yuen's
    trimmed-mean difference (Yuen 1974) of the two sides' `robust` estimates. Both add the
    drift (the stored baseline's session offset, a known variance component). se nan below
    2 runs."""
    if design.paired:
        n = min(len(cand), len(inc))
        diffs = [a - b for a, b in zip(cand[:n], inc[:n], strict=True)]
        est, var, df = (detrended(diffs, mirror_separations(n, design.gap)) if design.detrend
                        else robust(diffs))
        if design.walk and not design.detrend and n >= 3:
            var = max(var, trend.walk_variance(diffs, design.gap, design.walk))
        se = math.sqrt(var + design.drift ** 2) if n >= 2 else math.nan
        return est, se, float(df)
    nc, ni = len(cand), len(inc)
    mc, vc, _ = robust(cand)
    mi, vi, _ = robust(inc)
    if nc < 2:
        return mc - mi, math.nan, 0.0
    vi = vi if ni >= 2 else vc  # one stored run: assume equal spreads
    return mc - mi, math.sqrt(vc + vi + design.drift ** 2), float(design.df(nc, ni))


def estimate(cand: Sequence[float], inc: Sequence[float], design: Design) -> tuple[float, float, float]:
    """(estimate of log(candidate / incumbent), its standard error, degrees of freedom) of
    tok/s runs; se nan below 2 runs."""
    return statistic([math.log(x) for x in cand], [math.log(x) for x in inc], design)


def _exp(x: float) -> float:
    """exp without overflow: a bound past e^709 is reported as infinite, not raised."""
    return math.exp(x) if x < 700.0 else math.inf


def look(cand: Sequence[float], inc: Sequence[float], bar: float, design: Design) -> Look:
    """The two tests at the look after len(cand) candidate runs.

    Decided on the log scale (est -/+ c se against log(bar)); the bounds shown are their
    exponentials, infinite where they would overflow, so a wide interval is never an error.
    """
    if not cand or not inc:
        raise ValueError("both sides need at least one run")
    if min(cand) <= 0 or min(inc) <= 0:
        raise ValueError("a run measured 0 tok/s")
    design = resolved(design, cand, inc)
    est, se, df = estimate(cand, inc, design)
    ratio, edge = _exp(est), math.log(bar)
    if math.isnan(se) or df <= 0:
        return Look(ratio, 0.0, math.inf, "undecided", len(cand), df, math.inf)
    if se == 0.0:
        decision: Decision = "pass" if est > edge else "fail" if est < edge else "undecided"
        return Look(ratio, ratio, ratio, decision, len(cand), df, 0.0)
    c_pass, c_fail = design.critical(len(cand), len(inc))
    lo_log, hi_log = est - c_pass * se, est + c_fail * se
    decision = "pass" if lo_log >= edge else "fail" if hi_log < edge else "undecided"
    return Look(ratio, _exp(lo_log), _exp(hi_log), decision, len(cand), df, se)
