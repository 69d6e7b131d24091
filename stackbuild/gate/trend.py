"""A swap's paired runs against time: their separations, the detrended difference, the slope test.

On a swap the incumbent is measured right before it is stopped, in mirror order
(decide.reference_order), and the candidate after the restart in index order: the two sides'
run i are `mirror_separations` apart. A machine that drifts linearly moves pair i by the
drift times that separation; `detrended` takes the drift out, `trends` says whether there is
one to take out (sequential.resolved uses it under within_gate_drift: auto).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from stackbuild.gate.stats import t_isf


@lru_cache(maxsize=64)
def mirror_separations(n: int, gap: int = 0) -> tuple[float, ...]:
    """How far apart in runs the two sides' run i are, halved, when the incumbent's runs were
    measured in mirror order right before the candidate's (decide.reference_order): the
    incumbent's run i (i + 1/2) runs before the switch, the candidate's i + 1/2 after it, and
    the `gap` runs' time of the restart between (decide.swap_gap) split between the two."""
    return tuple(i + 0.5 + gap / 2.0 for i in range(n))


def _fit(ds: Sequence[float], at: Sequence[float]) -> tuple[float, float, float, float, float]:
    """Least squares of ds on at: (mean at, mean ds, Sxx, slope, residual sum of squares)."""
    n = len(ds)
    mx, my = sum(at) / n, sum(ds) / n
    cx = [x - mx for x in at]
    sxx = sum(c * c for c in cx)
    sxy = sum(c * y for c, y in zip(cx, ds, strict=True))  # = sum (x - mx)(y - my)
    slope = sxy / sxx
    return mx, my, sxx, slope, max(0.0, sum((y - my) * (y - my) for y in ds) - slope * sxy)


def detrended(ds: Sequence[float], at: Sequence[float]) -> tuple[float, float, int]:
    """(the mean difference at separation 0, its variance, degrees of freedom) of paired
    differences `ds`, the two runs of pair i `at[i]` apart in time.

    The analysis of covariance of the paired log ratio on time (Cochran 1957, Biometrics
    13:261-281): d_i = mu + beta at_i + e_i, least squares. A linear trend shared by both
    sides moves pair i by beta at_i; mu, the intercept, is the difference with the two runs
    measured at once. Var(mu) = s^2 (1/n + mean(at)^2 / Sxx), s^2 the residual variance on
    n - 2 degrees of freedom (the slope costs one). Below 3 pairs: no variance (nan).
    """
    n = len(ds)
    if n < 3:
        return (sum(ds) / n if n else 0.0), math.nan, max(0, n - 2)
    mx, my, sxx, slope, rss = _fit(ds, at)
    return my - slope * mx, rss / (n - 2) * (1.0 / n + mx * mx / sxx), n - 2


def detrended_rows(ds: np.ndarray, gap: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`detrended` of each row (n >= 3 pairs at `mirror_separations(n, gap)`), for many rows at
    once (the null paths that size its boundaries: sequential._null_paths)."""
    n = ds.shape[1]
    at = np.array(mirror_separations(n, gap))
    mx, cx = at.mean(), at - at.mean()
    sxx, my = float(cx @ cx), ds.mean(axis=1)
    sxy = ds @ cx
    slope = sxy / sxx
    rss = np.maximum(0.0, ((ds - my[:, None]) ** 2).sum(axis=1) - slope * sxy)
    return my - slope * mx, rss / (n - 2) * (1.0 / n + mx * mx / sxx)


def trends(ds: Sequence[float], at: Sequence[float], level: float) -> bool:
    """Whether paired differences `ds` trend with their separations `at`: the least-squares
    slope's two-sided t test on n - 2 degrees of freedom rejects no slope at `level` (a
    preliminary test in Bancroft's sense, 1944, Ann. Math. Statist. 15:190-204: the comparison
    that follows is sized for it by bench/gate_calibration.py, not assumed). Below 4 pairs:
    no (one residual degree of freedom tells nothing)."""
    n = len(ds)
    if n < 4 or level <= 0:
        return False
    _, _, sxx, slope, rss = _fit(ds, at)
    if rss <= 0.0:
        return slope != 0.0
    return abs(slope) / math.sqrt(rss / (n - 2) / sxx) > t_isf(level / 2.0, n - 2)


@lru_cache(maxsize=64)
def _walk_basis(n: int, gap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """K_ij = 2 min(a_i, a_j) at a = mirror_separations(n, gap): the covariance of a random walk
    of variance 1 a run between pair i's two runs and pair j's (nested intervals about the
    switch). (its eigenvalues, eigenvectors, the eigenvectors' sums U'1, 1'K1)."""
    a = np.array(mirror_separations(n, gap))
    k = 2.0 * np.minimum.outer(a, a)
    lam, u = np.linalg.eigh(k)
    return lam, u, u.T @ np.ones(n), float(k.sum())


def walk_variance(ds: Sequence[float], gap: int, ratio: float) -> float:
    """The variance of the plain mean of a swap's paired differences `ds` (at
    `mirror_separations(len(ds), gap)`), allowing for a machine that wanders at random by
    `ratio` times a pair's own variance a run.

    A random walk of variance s^2 a run moves pair i by the walk between its two runs, 2 a_i
    runs apart, and the pairs' intervals are nested about the switch, so Cov(d_i, d_j) =
    sigma^2 [i = j] + s^2 K_ij, K_ij = 2 min(a_i, a_j): the local level model (Harvey 1989,
    Forecasting, Structural Time Series Models and the Kalman Filter, ch. 2) seen through the
    pairs, at the signal-to-noise ratio q = s^2 / sigma^2 = `ratio`. sigma^2 is estimated
    from the pairs' residuals under that covariance (generalised least squares, n - 1
    degrees of freedom); the mean's variance is then sigma^2 (n + q 1'K1) / n^2: the walk
    the pairs share (the restart's, and the inner pairs' inside the outer ones'), which their
    sample variance does not show. Below 3 pairs: nan."""
    n = len(ds)
    if n < 3:
        return math.nan
    return float(walk_variance_rows(np.asarray([ds], dtype=float), gap, ratio)[0])


def _gls(ds: np.ndarray, gap: int, ratios: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Generalised least squares of a mean, rows `ds` (rows x n pairs) under covariance I + q K at
    each of `ratios`, through K's eigenbasis: (residual sums of squares, rows x ratios;
    1'(I + q K)^-1 1 and log |I + q K|, each per ratio)."""
    lam, u, u1, _ = _walk_basis(ds.shape[1], gap)
    w = 1.0 / (1.0 + np.outer(ratios, lam))  # the eigenvalues of (I + q K)^-1, a row per q
    z = ds @ u
    b11 = w @ (u1 * u1)
    rss: np.ndarray = np.maximum((z * z) @ w.T - ((z * u1) @ w.T) ** 2 / b11, 0.0)
    return rss, b11, -np.log(w).sum(axis=1)


def walk_variance_rows(ds: np.ndarray, gap: int, ratio: float) -> np.ndarray:
    """`walk_variance` of each row (n >= 3 pairs), for many rows at once (sequential._null_paths)."""
    n = ds.shape[1]
    rss, _, _ = _gls(ds, gap, np.array([ratio]))
    var: np.ndarray = rss[:, 0] * ((n + ratio * _walk_basis(n, gap)[3]) / (n * n * (n - 1)))
    return var


def walk_rows(rng: np.random.Generator, rows: int, n: int, gap: int, ratio: float) -> np.ndarray:
    """The walk's part of `rows` rows of n pairs at `ratio` (a pair's own variance 1): pair
    i's walk over its interval, 2 a_i runs, each interval holding the one inside it."""
    a = np.array(mirror_separations(n, gap))
    steps = np.diff(np.concatenate(([0.0], 2.0 * a)))
    walked: np.ndarray = np.cumsum(rng.standard_normal((rows, n)) * np.sqrt(ratio * steps), axis=1)
    return walked


# the ratios `walk_seen` weighs: none, then 10^-3 .. 10^1 (a walk far below a pair's own
# noise a run to far above it)
_RATIOS = np.concatenate(([0.0], np.logspace(-3.0, 1.0, 41)))


def walk_seen(swaps: Sequence[tuple[Sequence[float], int]]) -> tuple[float, int]:
    """(the walk ratio q that the swaps' paired differences show, pairs used): restricted
    maximum likelihood (Patterson & Thompson 1971, Biometrika 58:545-554) of the local level
    model `walk_variance` allows for, each swap (its differences at
    `mirror_separations(n, gap)`) with its own mean and its own sigma^2 profiled out, q shared
    and taken from a grid (0, then 10^-3..10). A few swaps say little: the estimate is for
    `gate --plan` to show beside the declared ratio, not for the gate to decide by. Swaps of
    fewer than 4 pairs tell nothing (one degree of freedom past the mean and sigma^2): skipped."""
    total, pairs = np.zeros(len(_RATIOS)), 0
    for ds, gap in swaps:
        n = len(ds)
        if n < 4:
            continue
        rss, b11, logdet = _gls(np.asarray([ds], dtype=float), gap, _RATIOS)
        total += -0.5 * ((n - 1) * np.log(np.maximum(rss[0], 1e-300) / (n - 1)) + logdet + np.log(b11))
        pairs += n
    return (float(_RATIOS[int(np.argmax(total))]) if pairs else 0.0), pairs
