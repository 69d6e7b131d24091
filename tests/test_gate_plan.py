"""`gate --plan`: the noise earlier results showed, the run counts and duration it implies,
from the ledger through the CLI; and the deploy's choice of baseline by age and host."""

from __future__ import annotations

import math
import statistics
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

import pytest
from test_gate_stats import _run

from stackbuild.cli.main import main
from stackbuild.gate.decide import level_summary
from stackbuild.gate.plan import ASSUMED_SIGMA, noise_from, plan_text
from stackbuild.gate.result import GateResult
from stackbuild.host.decide import why_remeasure
from stackbuild.results.ledger import Ledger
from stackbuild.spec.profile import GateProfile

PROF = GateProfile(concurrency=(1, 8), tolerance=0.0, runs=3, max_runs=10, agreement_prompts=0)


def _result(name: str, at: str, c1: list[float], c8: list[float], *, secs: float = 2.0,
            host: dict[str, str] | None = None) -> GateResult:
    wl = PROF.workload()
    levels = []
    for c, xs in ((1, c1), (8, c8)):
        runs = [_run(x, index=i).model_copy(update={"concurrency": c, "duration_s": secs})
                for i, x in enumerate(xs)]
        levels.append(level_summary(c, runs))
    return GateResult(name=name, url="http://127.0.0.1:1", started_at=at, finished_at=at, workload=wl,
                      fingerprint=wl.fingerprint(), levels=tuple(levels), verdict="reference",
                      host=host or {})


def test_noise_from_results_of_this_workload() -> None:
    a = _result("base", "2026-11-01T00:00:00+00:00", [100.0, 102.0, 98.0], [400.0, 404.0, 396.0])
    b = _result("base", "2026-11-02T00:00:00+00:00", [110.0, 112.2, 107.8], [400.0, 404.0, 396.0])
    other = _result("x", "t", [1.0, 50.0], [1.0, 50.0]).model_copy(update={"fingerprint": "other"})
    seen = noise_from([a, b, other], PROF)
    want = statistics.stdev([math.log(x) for x in (100.0, 102.0, 98.0)])
    assert seen.results == 2 and want == pytest.approx(0.02, rel=1e-3)
    assert seen.levels[1].sigma == pytest.approx(want, rel=1e-3)
    assert seen.levels[8].sigma == pytest.approx(want / 2, rel=1e-3)
    assert seen.levels[1].run_s == 2.0 and seen.levels[1].tok_s == 107.8  # upper median of 6
    # C=1 moved 10% between the two sessions, C=8 not at all: the drift, pooled over the levels,
    # is the medians' spread less what the runs' own spread explains (sigma^2 / 3 a median)
    between = math.log(1.1) ** 2 / 2 - want ** 2 / 3 + 0.0 - (want / 2) ** 2 / 3
    assert seen.drift == pytest.approx(math.sqrt(between / 2), rel=1e-3)
    empty = noise_from([], PROF)
    assert empty.results == 0 and empty.levels[1].sigma == ASSUMED_SIGMA and empty.drift is None


def test_plan_text_says_runs_and_duration() -> None:
    quiet = noise_from([_result("base", "2026-11-01T00:00:00+00:00", [100.0, 100.4, 99.6],
                                [400.0, 401.6, 398.4], secs=30.0)], PROF)
    text = plan_text(PROF, quiet, stored=False, name="quick", trials=60)
    lines = text.splitlines()
    assert lines[0].startswith("gate plan quick: C=1,8, 128 in / 256 out, runs 3..10 a level, "
                               "against a live incumbent, alternating; at the noise 1 earlier")
    assert lines[1].startswith("  C=1: spread 0.4% a run; an equal build takes ~")
    assert "30 s a run" in lines[1]
    assert "an equal build passes 100% of the time" in lines[3]
    assert lines[4].startswith("  expected: ~") and "never more than the deadline" in lines[4]
    blind = plan_text(PROF, noise_from([], PROF), stored=True, trials=20)
    assert "no earlier result of this workload: an assumed 2% spread a run" in blind
    assert "against the incumbent measured right before the swap, on the same prompts" in blind
    assert "expected: unknown until a run of this workload is measured" in blind


def test_plan_says_when_a_swap_is_compared_detrended(capsys: pytest.CaptureFixture[str]) -> None:
    blind = noise_from([], PROF)
    said = "compared detrended (within_gate_drift: linear)"
    auto = ("  compared plain unless the paired runs trend with time over the swap (slope test "
            "at 10%), then detrended (within_gate_drift: auto)")
    walk = "; plain, allowing for a random walk of 0.05 of a pair's variance a run (within_gate_walk)"
    default = plan_text(PROF, blind, stored=True, trials=10)
    assert said not in default and auto + walk in default.splitlines()  # the default: auto
    assert auto in plan_text(PROF.with_overrides(within_gate_walk=0.0), blind, stored=True,
                             trials=10).splitlines()
    assert auto not in plan_text(PROF, blind, stored=False, trials=10)  # live: ABBA
    assert auto not in plan_text(PROF.with_overrides(within_gate_drift="none"), blind,
                                 stored=True, trials=10)
    linear = PROF.with_overrides(within_gate_drift="linear")
    assert said in plan_text(linear, blind, stored=True, trials=10)
    assert said not in plan_text(linear, blind, stored=False, trials=10)  # live: ABBA
    assert said not in plan_text(linear, blind, stored=True, fresh=False, trials=10)
    rc = main(["gate", "--plan", "--concurrency", "1", "--within-gate-drift", "quadratic"])
    assert rc == 2 and "--within-gate-drift" in capsys.readouterr().err


def test_plan_from_the_cli_reads_the_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "ledger.db"
    with Ledger(db) as ledger:
        ledger.record_gate(_result("base", "2026-11-01T00:00:00+00:00", [100.0, 102.0, 98.0],
                                   [400.0, 404.0, 396.0]))
    rc = main(["gate", "--plan", "--ledger", str(db), "--concurrency", "1,8", "--tolerance", "0",
               "--runs", "3", "--max-runs", "10", "--input-len", "128", "--output-len", "256"])
    out = capsys.readouterr().out
    assert rc == 0 and "at the noise 1 earlier results of this workload showed" in out, out
    assert "C=1: spread 2.0% a run" in out and "C=8: spread 1.0% a run" in out
    rc = main(["gate", "--concurrency", "1"])
    assert rc == 2 and "--url: missing" in capsys.readouterr().err


def test_a_stored_baseline_is_remeasured_when_old_or_from_another_host() -> None:
    fresh = _result("inc", "2026-11-01T00:00:00+00:00", [1.0], [1.0],
                    host={"gpu_model": "RTX PRO 6000", "gpu_count": "8", "driver": "580.1"})
    fresh = fresh.model_copy(update={"finished_at": datetime.now(UTC).isoformat()})
    facts = {"gpu_model": "RTX PRO 6000", "gpu_count": "8", "driver": "580.1", "arch": "sm_120"}
    assert why_remeasure(fresh, facts, 3600.0) is None
    assert why_remeasure(fresh, {**facts, "driver": "590.2"}, 3600.0) == \
        "the host changed since it was measured (driver 580.1 -> 590.2)"
    old = fresh.model_copy(update={"finished_at": "2026-01-01T00:00:00+00:00"})
    said = why_remeasure(old, facts, 7 * 86400.0)
    assert said is not None and said.endswith("h old, past the profile's bound of 168 h (a swap compares with the "
                                            "incumbent measured in this session)")
    assert why_remeasure(fresh.model_copy(update={"finished_at": "t"}), facts, 3600.0) == (
        "it is of unknown age, past the profile's bound of 1 h (a swap compares with the incumbent "
        "measured in this session)")


def test_a_stored_baseline_thinner_than_a_reference_is_remeasured() -> None:
    """A promotion the gate decided at its first look stores 3 runs: as a baseline that leaves
    the two-sample test 2 degrees of freedom, so the next deploy measures the incumbent again."""
    now = datetime.now(UTC).isoformat()
    thin = _result("inc", now, [1.0, 1.0, 1.0], [1.0] * 6).model_copy(update={"finished_at": now})
    assert PROF.model_copy(update={"reference_runs": None}).baseline_runs() == PROF.max_runs
    assert why_remeasure(thin, {}, 3600.0, 6) == \
        "it has fewer than the 6 runs a baseline needs at C=1 (its gate decided early)"
    assert why_remeasure(thin, {}, 3600.0, 3) is None



def test_a_stored_baseline_ended_more_runs_ago_than_the_candidate_may_take_is_remeasured() -> None:
    """A swap pairs its runs across the time since the incumbent's last run: past max_runs runs
    of it (a CI run: 38), the detrended comparison cannot decide, so the incumbent is measured again."""
    now = datetime.now(UTC).isoformat()
    ref = _result("inc", now, [100.0] * 4, [400.0] * 4, secs=0.5)
    # measured in mirror order: run 3 first, run 0 last, ending at t = 1000 + 2.0
    ref = ref.model_copy(update={"levels": tuple(lv.model_copy(update={"runs": tuple(
        r.model_copy(update={"started": 1000.0 + 0.5 * (3 - r.index)}) for r in lv.runs)}) for lv in ref.levels)})
    assert why_remeasure(ref, {}, 3600.0, 1, 10, now=1002.0 + 5.0) is None  # 10 runs' time
    assert why_remeasure(ref, {}, 3600.0, 1, 10, now=1002.0 + 5.5) == (
        "it ended 11 runs' time ago, more than the 10 runs the candidate may take (a swap compares with the "
        "incumbent measured right before it)")
    assert why_remeasure(ref, {}, 3600.0, 1, None, now=1e6) is None

def test_swap_remeasures_an_old_stored_baseline_before_stopping_the_incumbent() -> None:
    """On the fake host: the incumbent's stored result is a year old, so the deploy measures
    the incumbent again while it still serves, stores that, and gates the candidate on it."""
    from helpers_deploy import CANDIDATE, INCUMBENT, PATHS, FakeGate, run, with_incumbent

    host = with_incumbent()
    (path,) = [p for p in host.files if p.startswith(PATHS.result_file("")[:-5])]
    old = GateResult.model_validate_json(host.files[path])
    host.files[path] = old.model_copy(update={"finished_at": "2025-11-01T00:00:00+00:00"}).model_dump_json()
    gate = FakeGate(host)
    rep = run(host, gate=gate)
    assert (rep.outcome, rep.verdict) == ("promoted", "pass"), rep.render()
    said = next(s.detail for s in rep.steps if s.name == "baseline")
    # the bound is the fresher of baseline_max_age_s and fresh_baseline_s (1 h)
    assert "not used: it is" in said and "past the profile's bound of 1 h" in said
    assert said.endswith("measured the incumbent now (fingerprint " + old.fingerprint + ")")
    # the incumbent was measured first, while it served, then the candidate against it
    first, second = gate.calls
    assert (first.served_by, first.baseline) == (INCUMBENT, None)
    assert (second.served_by, second.baseline) == (CANDIDATE, first.name)
    fresh = GateResult.model_validate_json(host.files[path])
    assert fresh.finished_at != "2025-11-01T00:00:00+00:00"


def test_the_deploy_dry_run_prints_the_gate_plan(tmp_path: Path) -> None:
    from helpers_deploy import request, services, with_incumbent

    from stackbuild.host.deploy import deploy
    from stackbuild.host.dryrun import DryRunRemote
    from stackbuild.results.ledger import gate_plan

    host = with_incumbent()
    said: list[str] = []
    svc = services(host, echo=said.append, gate_plan=lambda prof, stored: gate_plan(
        prof, tmp_path / "ledger.db", stored=stored, trials=20))
    rep = deploy(DryRunRemote(host.address, reader=host, echo=said.append), request("swap"), svc)
    assert rep.outcome == "planned"
    (plan,) = [s for s in said if s.startswith("gate plan")]
    assert "runs 6..16 a level, against the incumbent measured right before the swap" in plan
    assert "never more than the deadline" in plan


def test_the_summary_names_the_baseline_and_its_age() -> None:
    from stackbuild.gate.formats import baseline_text, markdown_summary

    res = _result("cand", "2026-11-02T00:00:00+00:00", [100.0], [400.0]).model_copy(update={
        "baseline_name": "incumbent sim", "baseline_source": "stored",
        "baseline_measured_at": "2026-11-01T00:00:00+00:00", "baseline_age_s": 172800.0,
        "session_drift": 0.01, "margin": 0.02})
    assert baseline_text(res) == ("stored result incumbent sim of 2026-11-01T00:00:00+00:00, 2.0 d old; "
                                  "session drift 1.0% in the intervals")
    assert "· margin 2% ·" in markdown_summary(res)
    live = res.model_copy(update={"baseline_source": "live", "baseline_name": "http://127.0.0.1:2"})
    assert baseline_text(live) == "live http://127.0.0.1:2 (runs alternating, compared pairwise)"


def _swap(at: str, cand: list[float], inc: list[float], gap: int) -> GateResult:
    """A swap's result: the candidate's runs against the incumbent's measured right before."""
    r = _result("cand", at, cand, cand)
    levels = tuple(lv.model_copy(update={"baseline_runs_tok_s": tuple(inc), "swap_gap": gap, "paired": False})
                   for lv in r.levels)
    return r.model_copy(update={"levels": levels, "baseline_source": "stored"})


def test_plan_reads_the_walk_the_swaps_showed() -> None:
    """The swaps' pairs, log(candidate run i / incumbent run i), at each level's restart, are
    what trend.walk_seen weighs; the plan says what it saw and asks for more allowance when it
    saw more than the profile allows for. Results that are no swap add nothing."""
    inc = [100.0, 101.0, 99.0, 100.5, 99.5]
    near = [100.2, 100.9, 99.3, 100.4, 99.8]  # pairs that hold still
    # pairs that wander, each one further from the switch carrying the walk of the one inside it
    far = [i * math.exp(d) for i, d in zip(inc, (0.002, 0.011, 0.006, 0.021, 0.034), strict=True)]
    quiet = noise_from([_swap("2026-11-01T00:00:00+00:00", near, inc, 3)], PROF)
    loud = noise_from([_swap("2026-11-01T00:00:00+00:00", far, inc, 3)], PROF)
    pairs = [math.log(c / i) for c, i in zip(far, inc, strict=True)]
    from stackbuild.gate.trend import walk_seen

    assert loud.walk == walk_seen([(pairs, 3), (pairs, 3)])[0] and loud.walk_pairs == 10  # both levels
    assert quiet.walk is not None and quiet.walk < loud.walk
    assert noise_from([_result("base", "t", inc, inc)], PROF).walk is None  # no swap among them
    said = plan_text(PROF, loud, stored=True, trials=10)
    line = next(ln for ln in said.splitlines() if "random walk of" in ln and "showed" in ln)
    assert line == (f"  the swaps' pairs showed a random walk of {loud.walk:.3g} of a pair's variance a run "
                    "(10 pairs; the profile allows for 0.05)"
                    + (": set within_gate_walk to keep the stated errors" if loud.walk > 0.05 else ""))
    assert loud.walk > 0.05
    assert "showed a random walk" not in plan_text(PROF, loud, stored=False, trials=10)  # live: ABBA


def test_plan_says_when_the_runs_were_more_correlated_than_allowed_for(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Runs that rise and fall together (the simulator's C=8 on an idle machine: lag-1 0.31-0.67 in
    three series of 30) are pooled from the ledger; past the profile's run_correlation + 0.1 the plan asks for
    more, and `gate --run-correlation` is how to say it."""
    slow = [400.0 * math.exp(0.01 * math.sin(i / 3.0)) for i in range(12)]  # a slow wave
    db = tmp_path / "ledger.db"
    with Ledger(db) as ledger:
        for day in ("01", "02"):
            ledger.record_gate(_result("base", f"2026-11-{day}T00:00:00+00:00", slow, slow))
    xs = [math.log(x) for x in slow]
    dev = [x - statistics.fmean(xs) for x in xs]
    lag1 = sum(a * b for a, b in pairwise(dev)) / sum(d * d for d in dev)
    args = ["gate", "--plan", "--ledger", str(db), "--concurrency", "1,8", "--tolerance", "0",
            "--runs", "3", "--max-runs", "10", "--input-len", "128", "--output-len", "256"]
    assert main(args) == 0
    out = capsys.readouterr().out
    said = [ln for ln in out.splitlines() if ln.startswith("  successive runs were correlated")]
    assert said == [f"  successive runs were correlated {lag1:.2f} (the profile assumes 0.4): set "
                    "run_correlation (gate --run-correlation) to keep the stated errors, or make the runs longer "
                    "(more requests a run: min_requests) than the machine's slow states last"], out
    assert main([*args, "--run-correlation", f"{lag1 - 0.05:.2f}"]) == 0
    assert "successive runs were correlated" not in capsys.readouterr().out
    assert main([*args, "--run-correlation", "0.9"]) == 2  # below 0.9 only
    assert "--run-correlation" in capsys.readouterr().err
