"""The arrays behind the sequential test's null simulation (stackbuild.gate.sequential sizes its
boundaries on them): numpy's part of the gate, kept apart from stats.py's pure functions
(percentiles, Student's t) that the load generator and the report read."""

from __future__ import annotations

import math

import numpy as np


def ar1_rows(rng: np.random.Generator, paths: int, n: int, rho: float) -> np.ndarray:
    """Rows of n standard normal draws, each correlated rho with the one before (stationary
    AR(1): the first draw of a row is N(0, 1), so is every later one)."""
    z = rng.standard_normal((paths, n))
    keep = math.sqrt(1.0 - rho * rho)
    for k in range(1, n):
        z[:, k] = rho * z[:, k - 1] + keep * z[:, k]
    return z


def trimmed_rows(xs: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's (n >= 2 values) mean trimmed of g values at each end and that mean's
    variance from the winsorized variance (Tukey & McLaughlin 1963): `sequential.robust`
    for many rows at once."""
    n = xs.shape[1]
    s = np.sort(xs, axis=1)
    wins = s.copy()
    wins[:, :g] = s[:, g:g + 1]
    wins[:, n - g:] = s[:, n - g - 1:n - g]
    return s[:, g:n - g].mean(axis=1), wins.var(axis=1, ddof=1) / (n * (1.0 - 2.0 * g / n) ** 2)
