"""The gate's decisions hold their error rates: a small run of bench/gate_calibration.py
(the real judge, run loop and verdict on synthetic runs, fixed seed), the sequential loop
driven without HTTP, and every phase of a gate within its deadline (no server: the phases
are the runner's own, the measurement a fake that sleeps)."""

from __future__ import annotations

import asyncio
import importlib.util
import random
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from stackbuild.gate import runner
from stackbuild.gate.decide import design_for, run_level
from stackbuild.gate.result import RunMetrics
from stackbuild.gate.simulate import USERS_NOISE, Noise, drive, rates, run_metrics, trial
from stackbuild.spec.profile import BUILTIN_PROFILES, GateProfile

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gate_calibration.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gate_calibration", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gate_calibration"] = mod  # its process pool pickles by module name
    spec.loader.exec_module(mod)
    return mod


def test_the_harness_at_the_bar_and_for_equal_builds() -> None:
    """A small run, seed 7: the users' swap at the bar (stated errors 2.5% each; bound 2.5%
    + 2.5 binomial sds at 300 trials) and an equal build, the incumbent measured right before
    on the same prompts. The full run (every cell) is in docs/gate.md."""
    bench = _bench()
    lines: list[str] = []
    out = bench.main(["--trials", "300", "--models", "users", "--cells", "bar,equal",
                      "--jobs", "1", "--seed", "7", "--capacity-trials", "0"], echo=lines.append)
    assert out["users.false_fail"] <= 0.047 and out["users.false_pass"] <= 0.047, lines
    assert out["users.equal_pass"] >= 0.7, lines
    assert lines[-1].startswith("gate_calibration: cell=users false_fail=") and \
        "equal_pass=" in lines[-1] and "runs_mean=" in lines[-1]
    table = [ln.split() for ln in lines if ln.startswith("users ")]
    assert [row[-7] for row in table] == ["bar", "equal"]
    assert float(table[1][-4]) <= 0.025, table  # equal: few fails


def test_the_loop_stops_when_it_can_decide_and_never_past_max_runs() -> None:
    prof = GateProfile(concurrency=(8,), tolerance=0.0, runs=3, max_runs=15)
    design = design_for(prof, paired=True)
    taken: list[int] = []

    async def take(i: int) -> tuple[RunMetrics, RunMetrics | None]:
        taken.append(i)
        return run_metrics(8, i, 80.0 * (1 + 0.001 * (i % 3))), run_metrics(8, i, 100.0)

    lv = drive(run_level(8, take, prof, design, None, live=True))
    assert lv.verdict == "fail" and 3 <= len(taken) < 15 and taken == list(range(len(taken)))

    async def same(i: int) -> tuple[RunMetrics, RunMetrics | None]:
        taken.append(i)
        return run_metrics(8, i, 100.0 + (i % 3)), run_metrics(8, i, 100.0 + ((i + 1) % 3))

    taken.clear()
    lv = drive(run_level(8, same, prof.with_overrides(margin=0.0), design, None, live=True))
    assert lv.verdict == "inconclusive" and len(taken) == 15  # no margin: an equal build cannot pass
    assert "cannot tell after 15 runs" in lv.reasons[0]


def test_a_reference_takes_reference_runs() -> None:
    prof = BUILTIN_PROFILES["users"].with_overrides(concurrency=(1,))

    async def alone(i: int) -> tuple[RunMetrics, RunMetrics | None]:
        return run_metrics(1, i, 90.0), None

    lv = drive(run_level(1, alone, prof, design_for(prof, paired=False), None))
    assert lv.verdict == "reference" and len(lv.runs) == 10


def test_families_of_levels_hold_the_false_fail_rate() -> None:
    """Three required levels, each exactly at its bar: the gate fails (any level failing)
    no more often than alpha over the family (Bonferroni on the fail side)."""
    prof = BUILTIN_PROFILES["users"].with_overrides(tolerance=0.0, runs=3, max_runs=6)
    noise = Noise("x", {1: 0.03})
    got = rates(prof, noise, {c: prof.bar(c) for c in prof.concurrency}, stored=False,
                stored_runs=0, trials=400, seed=3)
    assert got.failed <= 0.044 and got.passed == 0.0


def test_a_stored_baseline_that_drifted_costs_no_false_fail() -> None:
    prof = BUILTIN_PROFILES["users"].with_overrides(concurrency=(1,), tolerance=0.0)
    drifted = Noise("d", USERS_NOISE.sigma, session=0.01)
    rng = random.Random(5)
    verdicts = [trial(prof, drifted, {1: 0.98}, stored=True, stored_runs=10, rng=rng).verdict
                for _ in range(300)]
    assert verdicts.count("fail") / 300 <= 0.048 and verdicts.count("pass") / 300 <= 0.048


def test_every_phase_ends_by_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server whose every run takes 0.2 s, a gate of 20 runs a side and slow agreement and
    capacity checks, a deadline of 1.5 s: the gate returns by then, the cut phases failed."""
    async def slow_run(url: str, wl: object, c: int, index: int, **_: object) -> RunMetrics:
        await asyncio.sleep(0.2)
        return run_metrics(c, index, 100.0)

    async def never(*_: object, **__: object) -> None:
        await asyncio.sleep(60)

    async def no_warmup(*_: object) -> list[object]:
        return []

    monkeypatch.setattr(runner, "_reachable", lambda *a: None)
    monkeypatch.setattr(runner, "host_facts", lambda url: {})
    monkeypatch.setattr(runner.loadgen, "run_once", slow_run)
    monkeypatch.setattr(runner.loadgen, "warmup", no_warmup)
    monkeypatch.setattr(runner, "_probe", never)
    monkeypatch.setattr(runner.checks, "agreement_check", never)
    monkeypatch.setattr(runner.checks, "capacity_check", never)
    prof = GateProfile(concurrency=(1, 8), runs=20, max_runs=20, deadline_s=1.5,
                       slo={"itl_p99_ms": 50.0})
    t0 = time.monotonic()
    res = runner.run_gate("http://127.0.0.1:1", prof, name="c", baseline_url="http://127.0.0.1:2")
    took = time.monotonic() - t0
    assert took < 1.5 + 10, took  # bounded by the deadline, not by the 60 s the stubs would hold it
    assert res.verdict == "fail"
    assert res.levels[0].reasons == ("C=1: the gate's deadline of 1.5s passed before this level finished",)
    assert res.probe is not None and not res.probe.passed
    assert res.agreement is not None and not res.agreement.passed
    assert res.capacity is not None and not res.capacity.passed
    assert any("capacity: the gate's deadline of 1.5s passed" in r for r in res.reasons)
