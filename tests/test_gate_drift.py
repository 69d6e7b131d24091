"""A swap's comparison with its fresh incumbent under a drifting machine (issue 26).

The incumbent's runs are measured right before the swap in mirror order (the last prompt set
first: decide.reference_order), so the two sides' run i straddle the switch i + 1/2 runs
either side. Where the profile declares `within_gate_drift: linear` the paired log ratio is
compared detrended (sequential.detrended, the analysis of covariance on the pair's separation,
Cochran 1957): a linear drift shared by both sides is removed, at about twice the standard
error; by default ("none") it is compared plain. The error rates under a random-walk drift are
measured by bench/gate_calibration.py (its `drift` and `drift_lin` cells); a small seeded run
of the opt-in is held here.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from stackbuild.gate.decide import (
    design_for,
    detrends,
    level_summary,
    mirrored,
    reference_order,
    run_level,
)
from stackbuild.gate.result import RunMetrics
from stackbuild.gate.sequential import Design, detrended, mirror_separations, statistic
from stackbuild.gate.simulate import drive, rates, run_metrics
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


def test_the_default_profile_does_not_detrend_a_fresh_mirrored_swap() -> None:
    """The detrended intercept's variance is about 4 sigma^2 / n where the plain mean's is
    sigma^2 / n: equal builds of the users' swap passed 75% instead of 99.7% (issue: at least
    80%). So a profile left as it is compares a fresh mirrored swap plain."""
    for prof in (GateProfile(), *BUILTIN_PROFILES.values()):
        assert prof.within_gate_drift == "none"
        assert not detrends(prof, paired=False, fresh=True, mirrored=True)
        d = design_for(prof, paired=False, fresh=True, mirrored=True)
        assert not d.detrend and d.df(6, 0) == design_for(prof, paired=False, fresh=True).df(6, 0)


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


def test_the_opted_in_drift_cell_holds_its_false_fail_seeded() -> None:
    """The harness's drift_lin cell (random walk 0.5% a run, swap, fresh incumbent in mirror
    order, within_gate_drift: linear) at the bar, 100 seeded trials: the same every run (seed
    fixed, no clock), so its bound is no wall-clock luck. At 2000 trials
    bench/results/gate_calibration.txt says 2.5% each side is held; the plain drift cell (the
    default) reads about 11% a side."""
    bench = _bench()
    m = next(x for x in bench.models() if x.name == "drift_lin")
    assert m.profile.within_gate_drift == "linear"
    assert next(x for x in bench.models() if x.name == "drift").profile.within_gate_drift == "none"
    r = rates(m.profile, m.noise, bench.ratios(m, 0.0), stored=m.stored,
              stored_runs=m.stored_runs, trials=100, seed=26, fresh=m.fresh)
    assert r.failed <= 0.06 and r.passed <= 0.06, r.line()
