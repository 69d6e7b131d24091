"""A swap's comparison with its fresh incumbent under a drifting machine (issue 26).

The incumbent's runs are measured right before the swap in mirror order (the last prompt set
first: decide.reference_order), so the two sides' run i straddle the switch i + 1/2 runs
either side, and the restart between (decide.swap_gap) adds to every pair's separation. By
default (`within_gate_drift: auto`) the paired log ratio is compared plain unless it trends
with the separation (the slope's t test, trend.trends), then detrended
(trend.detrended, the analysis of covariance on the pair's separation, Cochran 1957): a
linear drift shared by both sides is removed, at about twice the standard error.
`linear` always detrends, `none` never. Compared plain, `auto` allows for a machine that
wanders at random by `within_gate_walk` of a pair's own variance a run (trend.walk_variance).
The error rates under a linear drift and a random walk are measured by
bench/gate_calibration.py (its `drift`, `walk` and `walk_lin` cells); a small seeded run of
each held here.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from stackbuild.gate.decide import (
    TREND_TEST,
    design_for,
    detrends,
    level_summary,
    mirrored,
    reference_order,
    run_level,
    swap_gap,
)
from stackbuild.gate.result import RunMetrics
from stackbuild.gate.sequential import Design, resolved, statistic
from stackbuild.gate.simulate import drive, rates, run_metrics
from stackbuild.gate.trend import detrended, mirror_separations, trends, walk_rows, walk_seen, walk_variance
from stackbuild.spec.profile import BUILTIN_PROFILES, GateProfile

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gate_calibration.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gate_calibration", BENCH)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gate_calibration"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_detrended_by_hand() -> None:
    # d = 1, 2, 4 at 0.5, 1.5, 2.5: mean x 1.5, mean d 7/3, Sxx 2, Sxy 3, slope 3/2;
    # intercept 7/3 - 3/2 * 3/2 = 1/12; residuals 1/6, -1/3, 1/6: RSS 1/6 on 1 df;
    # Var = 1/6 * (1/3 + 1.5^2 / 2) = 1/6 * 35/24 = 35/144
    est, var, df = detrended([1.0, 2.0, 4.0], [0.5, 1.5, 2.5])
    assert est == pytest.approx(1.0 / 12.0, abs=1e-12)
    assert var == pytest.approx(35.0 / 144.0, rel=1e-12)
    assert df == 1


def test_a_linear_trend_is_removed_exactly() -> None:
    at = mirror_separations(6)
    est, var, df = detrended([-0.03 + 0.004 * x for x in at], at)
    assert (est, df) == (pytest.approx(-0.03, abs=1e-12), 4)
    assert var == pytest.approx(0.0, abs=1e-18)


def test_below_three_pairs_there_is_no_variance() -> None:
    est, var, df = detrended([0.1, 0.3], [0.5, 1.5])
    assert est == pytest.approx(0.2) and math.isnan(var) and df == 0


def test_mirror_order_and_separations() -> None:
    assert reference_order(4) == [3, 2, 1, 0]
    assert mirror_separations(3) == (0.5, 1.5, 2.5)


def test_the_statistic_detrends_only_an_opted_in_mirrored_swap() -> None:
    # a machine slowing 1% a run: the incumbent's run i measured i + 1/2 runs before the
    # switch, the candidate's i + 1/2 after; the builds are equal
    inc = [-0.01 * (i + 0.5) for i in range(8)]
    cand = [0.01 * (i + 0.5) for i in range(8)]
    plain = statistic(cand, inc, Design(paired=True, first=3, last=8))
    trend = statistic(cand, inc, Design(paired=True, first=3, last=8, detrend=True))
    assert plain[0] == pytest.approx(0.08)  # the time between the pairs, read as a difference
    assert trend[0] == pytest.approx(0.0, abs=1e-12) and trend[2] == 6.0
    prof = BUILTIN_PROFILES["quick"].with_overrides(within_gate_drift="linear")
    assert design_for(prof, paired=False, fresh=True, mirrored=True).detrend
    assert not design_for(prof, paired=False, fresh=True).detrend  # runs in index order
    assert not design_for(prof, paired=False, mirrored=True).detrend  # another session's
    assert not design_for(prof, paired=True, fresh=True, mirrored=True).detrend  # live ABBA


def test_the_default_profile_tests_a_fresh_mirrored_swap_for_a_trend() -> None:
    """The detrended intercept's variance is about 4 sigma^2 / n where the plain mean's is
    sigma^2 / n: detrending every swap, equal builds of the users' swap passed 75% instead of
    99.7% (issue: at least 80%). So a profile left as it is ("auto") compares a fresh mirrored
    swap plain, and detrended only where its pairs trend with time."""
    for prof in (GateProfile(), *BUILTIN_PROFILES.values()):
        assert prof.within_gate_drift == "auto"
        assert not detrends(prof, paired=False, fresh=True, mirrored=True)
        d = design_for(prof, paired=False, fresh=True, mirrored=True, gap=3)
        assert not d.detrend and d.trend_test == TREND_TEST and d.gap == 3
        assert d.df(6, 0) == design_for(prof, paired=False, fresh=True).df(6, 0)
        # live (ABBA), another session's, or runs in index order: no test, no gap
        for other in (design_for(prof, paired=True, fresh=True, mirrored=True, gap=3),
                      design_for(prof, paired=False, mirrored=True, gap=3),
                      design_for(prof, paired=False, fresh=True, gap=3)):
            assert other.trend_test == 0.0 and other.gap == 0
    never = BUILTIN_PROFILES["quick"].with_overrides(within_gate_drift="none")
    assert design_for(never, paired=False, fresh=True, mirrored=True).trend_test == 0.0


def test_the_slope_test_by_hand() -> None:
    # d = 0, 1, 2, 3.5 at 0.5..3.5: Sxx 5, Sxy 5.75, slope 1.15; RSS 6.6875 - 1.15 * 5.75 =
    # 0.075 on 2 df: se of the slope sqrt(0.0375 / 5) = 0.0866, t = 13.3; t(0.975, 2) = 4.30,
    # t(0.9995, 2) = 31.6
    ds, at = [0.0, 1.0, 2.0, 3.5], [0.5, 1.5, 2.5, 3.5]
    assert trends(ds, at, 0.05)
    assert not trends(ds, at, 0.001)
    assert not trends(ds[:3], at[:3], 0.5)  # below 4 pairs: never
    assert not trends([0.2, -0.1, 0.3, 0.0], at, 0.05)  # t = -0.3
    assert trends([0.1, 0.2, 0.3, 0.4], at, 0.05)  # on a line: no residual, a slope


def test_a_look_detrends_only_where_the_pairs_trend() -> None:
    auto = Design(paired=True, first=4, last=8, trend_test=0.05, gap=3)
    inc = [100.0] * 8
    flat = [100.0 * math.exp(e) for e in (0.01, -0.012, 0.004, 0.0, -0.006, 0.011, -0.003, 0.002)]
    assert resolved(auto, flat, inc) == Design(paired=True, first=4, last=8)
    # a drift of 0.5% a run: pair i is 2i + 1 + 3 runs apart, d_i = 0.005 (2i + 4) + noise
    at = mirror_separations(8, 3)
    assert at[0] == 2.0 and at[1] == 3.0  # half the separation: (2i + 1 + gap) / 2
    noise = (0.001, -0.002, 0.0, 0.002, -0.001, 0.0, 0.001, -0.002)
    drifting = [100.0 * math.exp(0.01 * x + e) for x, e in zip(at, noise, strict=True)]
    got = resolved(auto, drifting, inc)
    assert got == Design(paired=True, first=4, last=8, detrend=True, gap=3)
    est, _, _ = statistic([math.log(x) for x in drifting], [math.log(x) for x in inc], got)
    assert est == pytest.approx(0.0, abs=0.003)  # the drift through the restart extrapolated
    plain, _, _ = statistic([math.log(x) for x in drifting], [math.log(x) for x in inc],
                            Design(paired=True, first=4, last=8))
    assert plain == pytest.approx(0.01 * sum(at) / 8, abs=0.002)  # read as a 3.8% difference


def test_a_reference_measured_on_a_server_just_started_is_no_drift() -> None:
    """The runs of a fresh-clone CI (tests/test_deploy_switch.py, side-by-side, idle machine): the
    reference was measured right after its server started, its first-measured runs (the high
    indices, in mirror order) slow from the warm-up; the candidate's runs are flat. Testing the
    reference on its own for a trend read that warm-up as a drift of the machine, and the
    detrended comparison, extrapolated over the restart, read the equal build 25% slower
    (-58%..+32%): inconclusive. The pairs show it only at 9 runs, where the plain comparison
    had long decided."""
    inc = [1047.0, 1021.0, 1059.0, 1067.0, 978.0, 1047.0, 1063.0, 918.0, 905.0, 760.0]
    cand = [1074.0, 1080.0, 1066.0, 1090.0, 1103.0, 1082.0, 1088.0, 995.0, 1089.0, 1111.0]
    auto = Design(paired=True, first=3, last=10, trend_test=TREND_TEST, gap=30)
    assert [resolved(auto, cand[:n], inc).detrend for n in range(3, 11)] == [False] * 6 + [True] * 2
    plain = resolved(auto, cand[:5], inc)
    est, _, _ = statistic([math.log(x) for x in cand[:5]], [math.log(x) for x in inc], plain)
    assert math.exp(est) == pytest.approx(1.047, abs=0.001)  # the mean of the 5 log ratios


def test_the_swap_gap_is_read_from_the_reference_runs_start_times() -> None:
    runs = [_run(0, 100.0), _run(1, 88.0), _run(2, 76.0)]
    runs = [r.model_copy(update={"duration_s": d}) for r, d in zip(runs, (10.0, 12.0, 8.0), strict=True)]
    assert swap_gap(runs, 140.0) == 3  # (140 - 100 - 10) / mean 10
    assert swap_gap(runs, 111.0) == 0
    assert swap_gap(runs, 90.0) == 0  # a clock that went back: none
    assert swap_gap([_run(0, None), _run(1, None)], 140.0) == 0  # no start times kept
    assert swap_gap([_run(1, 88.0)], 140.0) == 0  # no run of index 0


def test_a_bad_within_gate_drift_is_refused() -> None:
    with pytest.raises(ValueError, match="within_gate_drift"):
        GateProfile.model_validate({"within_gate_drift": "quadratic"})
    with pytest.raises(ValueError, match="within_gate_drift"):
        BUILTIN_PROFILES["quick"].with_overrides(within_gate_drift="yes")


def test_detrended_information_and_degrees_of_freedom() -> None:
    d = Design(paired=True, first=4, last=6, detrend=True)
    assert [d.df(n, 0) for n in (4, 5, 6)] == [2, 3, 4]
    # 1 / (1/n + mean(x)^2 / Sxx) at x = i + 1/2: n (n^2 - 1) / (4 n^2 - 1)
    info = [n * (n * n - 1) / (4 * n * n - 1) for n in (4, 5, 6)]
    assert d.fractions(0) == pytest.approx(tuple(i / info[-1] for i in info))


def _run(i: int, started: float | None) -> RunMetrics:
    return run_metrics(1, i, 100.0).model_copy(update={"started": started})


def test_mirrored_reads_the_start_times() -> None:
    assert mirrored([_run(0, 30.0), _run(1, 20.0), _run(2, 10.0)])
    assert not mirrored([_run(0, 10.0), _run(1, 20.0), _run(2, 30.0)])
    assert not mirrored([_run(0, None), _run(1, None)])  # written before start times were kept
    assert not mirrored([_run(0, 30.0)])


def test_a_result_without_start_times_still_reads() -> None:
    old = run_metrics(1, 0, 100.0).model_dump()
    del old["started"]
    assert RunMetrics.model_validate(old).started is None


def test_a_reference_is_measured_last_index_first_and_kept_in_index_order() -> None:
    prof = BUILTIN_PROFILES["quick"].with_overrides(concurrency=(8,))
    measured: list[int] = []

    async def take(i: int) -> tuple[RunMetrics, RunMetrics | None]:
        measured.append(i)
        return _run(i, float(len(measured))), None

    design = design_for(prof, paired=False)
    lv = drive(run_level(8, take, prof, design, None))
    n = prof.baseline_runs()
    assert measured == list(range(n - 1, -1, -1))
    assert [r.index for r in lv.runs] == list(range(n))
    assert mirrored(list(lv.runs))
    assert [r.index for r in level_summary(8, [_run(2, 1.0), _run(0, 3.0), _run(1, 2.0)]).runs] == [0, 1, 2]


def _cell(name: str, trials: int, seed: int) -> str:
    bench = _bench()
    m = next(x for x in bench.models() if x.name == name)
    r = rates(m.profile, m.noise, bench.ratios(m, 0.0), stored=m.stored,
              stored_runs=m.stored_runs, trials=trials, seed=seed, fresh=m.fresh)
    assert r.failed <= 0.06 and r.passed <= 0.06, r.line()
    return m.profile.within_gate_drift


def test_the_drift_cell_holds_its_errors_as_a_user_leaves_the_profile_seeded() -> None:
    """The harness's drift cell (linear 0.5% a run, swap, fresh incumbent in mirror order, the
    profile as a user leaves it: auto) at the bar, 100 seeded trials: the same every run
    (seed fixed, no clock), so its bound is no wall-clock luck. At 2000 trials docs/gate.md
    states both errors; compared plain ("none") the same drift reads as a difference."""
    assert _cell("drift", 100, 26) == "auto"


def test_the_opted_in_walk_cell_holds_its_errors_seeded() -> None:
    """The walk_lin cell (a random walk, within_gate_drift: linear), 100 seeded trials."""
    assert _cell("walk_lin", 100, 26) == "linear"


def test_the_walk_cell_holds_its_errors_as_a_user_leaves_the_profile_seeded() -> None:
    """The walk cell (a random walk of 0.5% a run pair, the profile as a user leaves it: auto,
    within_gate_walk 0.05), 100 seeded trials. Compared plain without the walk's allowance it
    read 9.2% / 8.0% at 2000 trials (docs/gate.md)."""
    assert _cell("walk", 100, 26) == "auto"


def _walk_variance_by_matrices(ds: list[float], gap: int, q: float) -> float:
    """The same quantity by explicit matrices: V = I + q K, sigma^2 from the generalised least
    squares residuals, the plain mean's variance 1' (sigma^2 V) 1 / n^2."""
    n = len(ds)
    a = np.array(mirror_separations(n, gap))
    v = np.eye(n) + q * 2.0 * np.minimum.outer(a, a)
    vi = np.linalg.inv(v)
    one, d = np.ones(n), np.array(ds)
    mu = (one @ vi @ d) / (one @ vi @ one)
    r = d - mu
    sig2 = (r @ vi @ r) / (n - 1)
    return float(sig2 * (one @ v @ one) / (n * n))


def test_walk_variance_by_hand_and_by_matrices() -> None:
    # q = 0: the sample variance over n (0.01, -0.02, 0.005: mean -0.0016667, variance 2.5833e-4)
    ds = [0.01, -0.02, 0.005]
    assert walk_variance(ds, 0, 0.0) == pytest.approx(2.5833333e-4 / 3, rel=1e-6)
    # at 0.5, 1.5, 2.5 (no restart) K = 2 min(a_i, a_j) = [[1,1,1],[1,3,3],[1,3,5]], 1'K1 = 19
    for gap, q in ((0, 0.05), (3, 0.05), (7, 0.2)):
        xs = [0.01, -0.02, 0.005, 0.0, 0.012, -0.004]
        assert walk_variance(xs, gap, q) == pytest.approx(_walk_variance_by_matrices(xs, gap, q), rel=1e-9)
    assert walk_variance(ds, 0, 1.0) == pytest.approx(_walk_variance_by_matrices(ds, 0, 1.0), rel=1e-9)
    assert math.isnan(walk_variance([0.1, 0.2], 3, 0.05))  # below 3 pairs: none
    assert walk_variance([0.03] * 5, 3, 0.05) == 0.0  # pairs that agree exactly: no spread


def test_a_swap_compared_plain_allows_for_the_walk() -> None:
    """Under auto, a look whose pairs do not trend keeps the walk's allowance and the restart
    (the separations it needs); one that trends is detrended and allows for none; live (ABBA),
    another session's, `none` and `within_gate_walk: 0` never allow for one."""
    prof = BUILTIN_PROFILES["quick"]
    assert prof.within_gate_walk == 0.05 and GateProfile().within_gate_walk == 0.05
    d = design_for(prof, paired=False, fresh=True, mirrored=True, gap=3)
    assert d.walk == 0.05
    inc = [100.0] * 8
    flat = [100.0 * math.exp(e) for e in (0.01, -0.012, 0.004, 0.0, -0.006, 0.011, -0.003, 0.002)]
    plain = resolved(d, flat, inc)
    assert (plain.walk, plain.gap, plain.detrend, plain.trend_test) == (0.05, 3, False, 0.0)
    logs = [math.log(x) for x in flat], [math.log(x) for x in inc]
    diffs = [a - b for a, b in zip(*logs, strict=True)]
    _, se, _ = statistic(*logs, plain)
    assert se == pytest.approx(math.sqrt(walk_variance(diffs, 3, 0.05)), rel=1e-12)
    _, se0, _ = statistic(*logs, replace(plain, walk=0.0))
    assert se0 < 0.6 * se  # what the spread of 8 pairs shows: well under the walk it shares
    drifting = [100.0 * math.exp(0.01 * x) for x in mirror_separations(8, 3)]
    assert resolved(d, drifting, inc).walk == 0.0
    for other in (design_for(prof, paired=True, fresh=True, mirrored=True, gap=3),
                  design_for(prof, paired=False, mirrored=True, gap=3),
                  design_for(prof.with_overrides(within_gate_drift="none"), paired=False, fresh=True,
                             mirrored=True, gap=3),
                  design_for(prof.with_overrides(within_gate_walk=0.0), paired=False, fresh=True,
                             mirrored=True, gap=3)):
        assert other.walk == 0.0


def test_a_bad_within_gate_walk_is_refused() -> None:
    for bad in (-0.1, 1.0, "some"):
        with pytest.raises(ValueError, match="within_gate_walk"):
            GateProfile.model_validate({"within_gate_walk": bad})


def test_walk_seen_reads_the_walk_of_many_swaps_seeded() -> None:
    """Pooled over 30 seeded swaps of 15 pairs (a 3 runs' restart, a pair's own sd 1%), the
    restricted-likelihood estimate lands near the walk they were drawn with, and near none for
    a machine that holds still; a swap below 4 pairs tells nothing."""
    rng = np.random.default_rng(26)

    def swaps(q: float) -> list[tuple[list[float], int]]:
        return [(list(0.01 * (rng.standard_normal(15) + walk_rows(rng, 1, 15, 3, q)[0])), 3)
                for _ in range(30)]

    still, n = walk_seen(swaps(0.0))
    assert n == 450 and still <= 0.01
    wandering, _ = walk_seen(swaps(0.2))
    assert 0.1 <= wandering <= 0.4
    assert walk_seen([([0.01, 0.02, 0.0], 3)]) == (0.0, 0)
