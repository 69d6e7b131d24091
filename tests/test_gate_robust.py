"""Issue 26: the gate decides whatever the runs throw at it. No overflow, one bad run does
not dominate, a look starts only where a boundary can be crossed, a computation problem
exits 4, the capacity's p99 interval is an order-statistic one, the simulator's
speculative acceptance is the prompt's, and an early-stopped level's traffic interval is
its repeated one."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest

from stackbuild.cli.main import main
from stackbuild.gate import checks
from stackbuild.gate.capacity import binom_cdf, quantile_interval
from stackbuild.gate.decide import design_for, judge_level, level_summary
from stackbuild.gate.formats import write_json
from stackbuild.gate.plan import LevelNoise, NoiseSeen, plan_text
from stackbuild.gate.result import GateResult
from stackbuild.gate.sequential import Design, look, robust, trim_count
from stackbuild.gate.simulate import run_metrics
from stackbuild.sim.calibration import PROFILES
from stackbuild.sim.model import PROMPT_ACCEPT_SD, Acceptance, Sampler
from stackbuild.spec.profile import BUILTIN_PROFILES, GateProfile


def test_the_overflow_reproduction_returns_a_verdict() -> None:
    """The issue's runs: at n = 3, se > 0.15 made exp(est + c se) overflow (exit 1)."""
    cand, inc = [102.9, 100.9, 67.2], [97.6, 98.2, 101.5]
    for design in (Design(paired=False, first=3, last=15), Design(paired=True, first=3, last=15)):
        lk = look(cand, inc, 0.98, design)
        assert lk.decision == "undecided" and lk.low >= 0.0 and lk.ratio > 0
    profile = BUILTIN_PROFILES["users"].with_overrides(tolerance=0.0, concurrency=(1,))
    lv = judge_level(level_summary(1, [run_metrics(1, i, x) for i, x in enumerate(cand)]), inc,
                     profile, final=True, design=design_for(profile, paired=False, fresh=True))
    assert lv.verdict == "inconclusive" and lv.reasons and "cannot tell after 3 runs" in lv.reasons[0]


def test_a_bound_past_exp_709_is_infinite_not_an_error() -> None:
    lk = look([1e300, 1e-300, 1e300], [1.0, 1.0, 1.0], 0.98, Design(paired=True, first=3, last=3))
    assert lk.decision == "undecided" and lk.high == math.inf and lk.low == 0.0


def test_a_computation_error_exits_4_never_1(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    import stackbuild.gate.runner as gate_runner

    def boom(*a: object, **k: object) -> None:
        raise OverflowError("math range error")

    monkeypatch.setattr(gate_runner, "run_gate", boom)
    assert main(["gate", "--url", "http://127.0.0.1:9", "--no-progress"]) == 4
    err = capsys.readouterr().err
    assert "a computation failed (OverflowError: math range error): not a verdict" in err
    assert "Traceback" not in err


def test_one_bad_run_does_not_dominate() -> None:
    """Twelve pairs 1% apart, one run 30% low: the trimmed mean sets it aside and passes; the
    plain mean (and its sd) would be pulled 2.5% down and say nothing."""
    rng = random.Random(3)
    inc = [100.0 * math.exp(rng.gauss(0, 0.003)) for _ in range(12)]
    cand = [x * 1.01 * math.exp(rng.gauss(0, 0.003)) for x in inc]
    cand[5] *= 0.7
    design = Design(paired=True, first=12, last=12)
    assert trim_count(12) == 1
    lk = look(cand, inc, 0.98, design)
    assert lk.decision == "pass" and lk.ratio == pytest.approx(1.01, abs=0.004)
    d = [math.log(c / i) for c, i in zip(cand, inc, strict=True)]
    mean = statistics.fmean(d)
    t = (mean - math.log(0.98)) / (statistics.stdev(d) / math.sqrt(12))
    assert t < 1.0  # what the untrimmed t would have said: nothing


def test_robust_is_the_tukey_mclaughlin_trimmed_mean() -> None:
    xs = [3.0, 1.0, 100.0, 0.0, 4.0, 5.0, 2.0, 7.0, 8.0, 6.0]  # g = 1: 0 and 100 set aside
    est, var, df = robust(xs)
    wins = [1.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 8.0]  # the winsorized runs
    assert est == pytest.approx(4.5) and df == 7
    assert var == pytest.approx(statistics.variance(wins) / (10 * 0.8 ** 2))
    assert robust([1.0, 2.0, 4.0]) == pytest.approx((7 / 3, statistics.variance([1, 2, 4]) / 3, 2))


def test_looks_start_where_a_boundary_can_be_crossed() -> None:
    """At 3 runs (2 df) the first O'Brien-Fleming boundary of 3..15 is ~10^3: no look there."""
    d = Design(paired=True, first=3, last=15).start()
    assert d.first > 3 and d.last == 15
    assert d.critical(d.first, 0)[0] <= 12.0 * 1.1
    assert Design(paired=True, first=15, last=15).start().first == 15


def test_order_statistic_interval_of_a_p99() -> None:
    assert binom_cdf(31, 32, 0.99) == pytest.approx(1 - 0.99 ** 32)
    xs = list(range(1, 33))
    point, low, high = quantile_interval(xs)
    assert (point, high) == (32, math.inf)  # 32 requests: no upper bound at 97.5%
    xs = list(range(1, 1001))
    _, low, high = quantile_interval(xs)
    # Bin(1000, 0.99): P(B <= 995) ~ 0.96..., so the bounds lie a few ranks either side of 990
    assert 980 <= low < 990 < high <= 1000
    assert binom_cdf(high - 1, 1000, 0.99) >= 0.975 > binom_cdf(high - 2, 1000, 0.99)


def test_speculative_acceptance_is_the_prompts() -> None:
    prof = PROFILES["eagle3-topk1-v2"]
    a, b = Acceptance(prof, [5, 6, 7], 0.0), Acceptance(prof, [5, 6, 7], 0.0)
    assert a.p == b.p and [a.rng.random() for _ in range(5)] == [b.rng.random() for _ in range(5)]
    ps = [Acceptance(prof, [i, i + 1], 0.0).p for i in range(4000)]
    assert statistics.fmean(ps) == pytest.approx(prof.accept_p, abs=0.004)
    assert statistics.stdev(ps) == pytest.approx(PROMPT_ACCEPT_SD, rel=0.06)
    # the run's residual is the sampler's (its seed), small
    one, two = Sampler(prof, seed=1).acceptance([5, 6, 7]), Sampler(prof, seed=2).acceptance([5, 6, 7])
    assert one.p != two.p and abs(one.p - two.p) < 0.03
    # no speculation: no residual either (accept_p is unused there)
    assert Sampler(PROFILES["baseline"], seed=1).acceptance([5]).p == \
        Acceptance(PROFILES["baseline"], [5], 0.0).p


def test_an_early_stopped_levels_traffic_interval_is_its_repeated_one() -> None:
    profile = BUILTIN_PROFILES["quick"].with_overrides(concurrency=(8,), tolerance=0.0,
                                                       traffic={8: 1.0}, runs=3, max_runs=15)
    rng = random.Random(1)
    inc = [100.0 * math.exp(rng.gauss(0, 0.01)) for _ in range(8)]
    runs = [run_metrics(8, i, x * 1.05 * math.exp(rng.gauss(0, 0.01))) for i, x in enumerate(inc)]
    lv = judge_level(level_summary(8, runs), inc, profile, final=False,
                     design=design_for(profile, paired=True), live=True)
    got = checks.traffic_verdict([lv], profile)
    full = profile.with_overrides(max_runs=8)
    same = checks.traffic_verdict([lv], full)  # the same runs, no look left: fixed sample
    assert got is not None and same is not None
    assert got.ci_high - got.ci_low > same.ci_high - same.ci_low


def test_the_plan_says_undecidable_against_a_stored_baseline_of_another_session() -> None:
    profile = BUILTIN_PROFILES["users"].with_overrides(tolerance=0.0)
    said = plan_text(profile, NoiseSeen(levels={}, drift=None, results=0), stored=True,
                     fresh=False)
    assert said.startswith("gate plan: undecidable: C=1,30,250 cannot be decided")
    swap = plan_text(profile, NoiseSeen(levels=_levels(profile), drift=None, results=0),
                     stored=True, trials=20)
    assert "measured right before the swap" in swap
    assert "if the incumbent is not serving at the swap" in swap


def _levels(profile: GateProfile) -> dict[int, LevelNoise]:
    return {c: LevelNoise(sigma=0.02, runs=0, run_s=None) for c in profile.concurrency}


def test_gate_refuses_an_undecidable_stored_baseline_before_measuring(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No server listens at the URL: the refusal comes before anything is reached (exit 2,
    not 4), naming what would make the configuration decidable."""
    wl = BUILTIN_PROFILES["quick"].workload()
    runs = [run_metrics(c, i, 100.0) for c in wl.concurrency for i in range(15)]
    levels = tuple(level_summary(c, [r for r in runs if r.concurrency == c]).model_copy(
        update={"verdict": "reference"}) for c in wl.concurrency)
    old = GateResult(name="incumbent", url="http://127.0.0.1:1", started_at="2025-01-01T00:00:00+00:00",
                     finished_at="2025-01-01T00:10:00+00:00", workload=wl,
                     fingerprint=wl.fingerprint(), levels=levels, verdict="reference")
    write_json(old, tmp_path / "old.json")
    rc = main(["gate", "--url", "http://127.0.0.1:9", "--baseline", str(tmp_path / "old.json"),
               "--tolerance", "0", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "cannot be decided against a stored baseline of another session" in err
    assert "--baseline-url" in err and "fresh measurement" in err
    # a wide enough bar decides; then the unreachable server is what stops it (exit 4)
    assert main(["gate", "--url", "http://127.0.0.1:9", "--baseline", str(tmp_path / "old.json"),
                 "--tolerance", "10", "--no-progress", "--ready-timeout", "0.5"]) == 4
