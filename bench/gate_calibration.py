"""The gate's error rates, measured: its own decision code on synthetic runs, many times.

Imports and drives the real per-level judge (stackbuild.gate.decide.judge_level), the real
sequential run loop (decide.run_level: the measurement is injected, here a noise model)
and the real overall verdict (decide.overall), through stackbuild.gate.simulate.trial.
For each cell (a noise model, a policy, a baseline) and each true ratio candidate/incumbent
-- at the bar, bar -5%, -2%, +2%, +5%, and equal (1.0) -- it reports P(pass), P(fail),
P(inconclusive) and the mean and 95th percentile of the candidate's runs per level, over
--trials trials a cell. Every profile is left as a user leaves it: run_correlation
undeclared (the default), session_drift the default 1%, within_gate_drift the default "auto"
(a swap compared plain unless its paired runs trend with time, then detrended; compared plain,
allowing for a random walk of within_gate_walk, 0.05 of a pair's variance a run), but for
walk_lin, which declares "linear".

Cells (stackbuild/gate/simulate.py says where each figure comes from):
  users    the users' C=1 spread, 5.4% a run, of which the prompts decide 5.4% (the same for
           both sides on the same seeded prompts) and 0.5% is a side's own (assumed:
           simulate.USERS_RESIDUAL says how it was chosen); their
           real path, swap: the incumbent measured right before the swap (15 runs), the
           candidate's run i paired with its run i, 3 runs' drift between; drifting 0.1% a
           run (a random walk); must not lose
  users3   their policy on their sweep: C=1 allowed -8%, C=30 and 250 must not lose; prompts
           5.4%/sqrt(C) (acceptance averages over C streams), residual 0.5% at every level;
           the same swap
  sim      the simulator's spread over HTTP, measured, its runs' autocorrelation included
           (lag-1 0.4 at C=8, 0.04 at C=32); the Done-when gate of issue 19: builtin
           `quick`, --concurrency 8,32 --tolerance 0, live incumbent in ABBA order
           (`--sim-ar`: another correlation at C=8; on an idle machine three series of 30
           runs read 0.67, 0.65 and 0.31)
  ar04     the same with every level's runs AR(1), lag-1 0.4
  drift    issue 26's "drift 0.5% a run": the simulator's spread at C=32, the machine
           drifting linearly 0.5% a run (up or down, each trial's own sign), through the
           restart too; swap against the incumbent measured right before, in mirror order
           (the last prompt set first: decide.reference_order); the profile as a user
           leaves it (within_gate_drift "auto")
  t3       the sim cell with each run's noise Student t on 3 degrees of freedom
  outlier  the sim cell with one run of each trial, on either side, 30% low
  session3 the users' swap whose stored result is of a session 3% away (the profile assumes
           1%): the deploy measures the incumbent right before it stops it and compares with
           that, so the stored result only shows the drift
  walk     the drift cell with the machine wandering instead: a random walk, sd 0.5% a run
           pair (`--walk`), the profile as a user leaves it (auto, within_gate_walk 0.05):
           the random-walk reading of the drift cell's line
  walk_lin the walk cell with the profile's within_gate_drift: linear (always detrended)
  still    the drift cell with a machine that holds still: what the walk's allowance costs a
           swap on the simulator's spread
  (each new cell last, so that the cells above keep their seeds: seed + 1000 x the cell's place)

A swap (users, users3, drift, session3, walk, walk_lin) has `--gap` runs' time between the
incumbent's last run and the candidate's first (the restart; default 3), the drift going on
through it: the detrended comparison extrapolates a linear drift over the gap (the
separations include it: decide.swap_gap); the plain one allows for a walk over it.

Then the capacity check: the real judge_step's p99 interval (TTFT, per request) over
requests of a lognormal latency at `capacity_min_requests`, how often it covers the true p99.

One line per cell, and last the capacity's:
`gate_calibration: cell=NAME false_fail=F false_pass=P equal_pass=E runs_mean=R`
`gate_calibration: capacity_coverage=C capacity_requests=N trials=T`
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

from stackbuild.gate.capacity import Q, judge_step
from stackbuild.gate.loadgen import RequestRecord
from stackbuild.gate.simulate import (
    SIM_NOISE,
    USERS_PROMPTED,
    USERS_RESIDUAL,
    Noise,
    Rates,
    rates,
    run_metrics,
)
from stackbuild.spec.profile import BUILTIN_PROFILES, GateProfile, LevelPolicy

OFFSETS: tuple[tuple[str, float | None], ...] = (
    ("bar-5%", -0.05), ("bar-2%", -0.02), ("bar", 0.0), ("bar+2%", 0.02), ("bar+5%", 0.05),
    ("equal", None))


@dataclass(frozen=True)
class Model:
    name: str
    what: str
    noise: Noise
    profile: GateProfile
    stored: bool
    stored_runs: int = 0
    fresh: bool = False


def models(walk: float = 0.005, sim_ar: float | None = None) -> list[Model]:
    quick = BUILTIN_PROFILES["quick"].with_overrides(concurrency=(8, 32), tolerance=0.0)
    users = BUILTIN_PROFILES["users"].with_overrides(tolerance=0.0)
    sweep = users.with_overrides(levels={1: LevelPolicy(tolerance=0.08)})
    swap = users.baseline_runs()
    prompted = USERS_PROMPTED.prompted(1)
    sim = SIM_NOISE if sim_ar is None else replace(SIM_NOISE, ar={**SIM_NOISE.ar, 8: sim_ar})
    users3 = Noise("users3", {c: USERS_RESIDUAL for c in (1, 30, 250)},
                   prompt={c: prompted / c ** 0.5 for c in (1, 30, 250)}, walk=0.001)
    return [
        Model("users", "C=1 must not lose, swap, fresh incumbent", replace(USERS_PROMPTED, walk=0.001),
              users.with_overrides(concurrency=(1,)), stored=True, stored_runs=swap, fresh=True),
        Model("users3", "C=1 -8%, C=30,250 must not lose, swap", users3, sweep,
              stored=True, stored_runs=swap, fresh=True),
        Model("sim", "C=8,32 must not lose, live (ABBA)", sim, quick, stored=False),
        Model("ar04", "the same, runs AR(1) 0.4 (undeclared)",
              replace(SIM_NOISE, ar={8: 0.4, 32: 0.4}), quick, stored=False),
        Model("drift", "C=32 must not lose, swap, linear 0.5%/run",
              Noise("drift", {32: SIM_NOISE.at(32)}, ar=SIM_NOISE.ar, trend=0.005),
              quick.with_overrides(concurrency=(32,)), stored=True,
              stored_runs=quick.baseline_runs(), fresh=True),
        Model("t3", "sim, runs t on 3 df", replace(SIM_NOISE, tails=3.0), quick, stored=False),
        Model("outlier", "sim, one run 30% low", replace(SIM_NOISE, outlier=0.3), quick,
              stored=False),
        Model("session3", "users, stored 3% away, fresh incumbent",
              replace(USERS_PROMPTED, walk=0.001, session=0.03),
              users.with_overrides(concurrency=(1,)), stored=True, stored_runs=swap, fresh=True),
        Model("walk", "C=32 must not lose, swap, random walk 0.5%",
              Noise("walk", {32: SIM_NOISE.at(32)}, ar=SIM_NOISE.ar, walk=walk),
              quick.with_overrides(concurrency=(32,)), stored=True,
              stored_runs=quick.baseline_runs(), fresh=True),
        Model("walk_lin", "walk, within_gate_drift: linear",
              Noise("walk", {32: SIM_NOISE.at(32)}, ar=SIM_NOISE.ar, walk=walk),
              quick.with_overrides(concurrency=(32,), within_gate_drift="linear"), stored=True,
              stored_runs=quick.baseline_runs(), fresh=True),
        Model("still", "C=32 must not lose, swap, no drift",
              Noise("still", {32: SIM_NOISE.at(32)}, ar=SIM_NOISE.ar),
              quick.with_overrides(concurrency=(32,)), stored=True,
              stored_runs=quick.baseline_runs(), fresh=True),
    ]


def capacity_coverage(trials: int, seed: int) -> tuple[float, int]:
    """How often the real judge_step's TTFT p99 interval holds the true p99: requests whose
    TTFT is lognormal (median 200 ms, sd of the log 0.5), at the default
    capacity_min_requests."""
    n = GateProfile().capacity_min_requests
    rng = random.Random(f"capacity:{seed}")
    true = 200.0 * math.exp(0.5 * statistics.NormalDist().inv_cdf(Q))
    hit = 0
    for _ in range(trials):
        recs = []
        for _ in range(n):
            ttft = 0.2 * math.exp(rng.gauss(0.0, 0.5))
            recs.append(RequestRecord(ok=True, start=0.0, end=ttft + 1.0, ttft=ttft,
                                      chunk_times=[ttft, ttft + 1.0], output_tokens=2))
        run = run_metrics(1, 0, 1.0)
        step = judge_step(1, run, recs, {"ttft_p99_ms": 1e9}, seed=rng.randrange(1 << 30))
        _, low, high = step.p99["ttft_p99_ms"]
        hit += low <= true <= high
    return hit / trials, n


def ratios(m: Model, offset: float | None) -> dict[int, float]:
    return {c: 1.0 if offset is None else m.profile.bar(c) * (1.0 + offset)
            for c in m.profile.concurrency}


def cell(args: tuple[int, int, int, int, int, str, float, float | None, float | None, float | None]) -> Rates:
    mi, oi, trials, seed, gap, within, walk, allow, sim_ar, rho = args
    m = models(walk, sim_ar)[mi]
    # None (or no --within-gate-drift) keeps the cell's own (GateProfile.with_overrides)
    profile = m.profile.with_overrides(within_gate_drift=within or None, within_gate_walk=allow,
                                       run_correlation=rho)
    return rates(profile, m.noise, ratios(m, OFFSETS[oi][1]), stored=m.stored,
                 stored_runs=m.stored_runs, trials=trials, seed=seed + 1000 * mi + oi,
                 fresh=m.fresh, gap=gap)


def main(argv: list[str] | None = None, echo: Callable[[str], None] = print) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2000, help="trials per cell (default 2000)")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--gap", type=int, default=3,
                    help="runs' time of restart between the incumbent and the candidate on a swap, "
                         "the drift going on through it (default 3)")
    ap.add_argument("--within-gate-drift", choices=("auto", "none", "linear"), default="",
                    help="every cell's profile with this within_gate_drift (default: as each "
                         "cell declares)")
    ap.add_argument("--walk", type=float, default=0.005,
                    help="the walk cells' random walk, sd a run pair (default 0.005)")
    ap.add_argument("--within-gate-walk", type=float, default=None,
                    help="every cell's profile with this within_gate_walk (default: the profile's)")
    ap.add_argument("--sim-ar", type=float, default=None,
                    help="the sim cell's lag-1 autocorrelation at C=8 (default: SIM_NOISE's 0.4)")
    ap.add_argument("--run-correlation", type=float, default=None,
                    help="every cell's profile with this run_correlation (default: the profile's)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--models", default=",".join(m.name for m in models()),
                    help="comma-separated subset")
    ap.add_argument("--cells", default=",".join(k for k, _ in OFFSETS),
                    help="comma-separated subset of the true ratios: bar-5%%,bar-2%%,bar,bar+2%%,bar+5%%,equal")
    ap.add_argument("--capacity-trials", type=int, default=2000,
                    help="trials of the capacity interval's coverage (0: skip)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    chosen = [i for i, m in enumerate(models()) if m.name in args.models.split(",")]
    cells = [i for i, (k, _) in enumerate(OFFSETS) if k in args.cells.split(",")]
    jobs = [(mi, oi, args.trials, args.seed, args.gap, args.within_gate_drift, args.walk, args.within_gate_walk,
             args.sim_ar, args.run_correlation)
            for mi in chosen for oi in cells]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            got = list(pool.map(cell, jobs))
    else:
        got = [cell(j) for j in jobs]
    res = {(models()[mi].name, OFFSETS[oi][0]): r for (mi, oi, *_), r in zip(jobs, got, strict=True)}
    echo(f"{'model':7} {'policy and baseline':44} {'true ratio':>16} {'P(pass)':>8} "
         f"{'P(fail)':>8} {'P(inc)':>7} {'runs':>5} {'p95':>4}")
    for mi in chosen:
        m = models()[mi]
        echo(f"# {m.name}: {m.noise.about or m.noise.name}" if m.noise.about else f"# {m.name}")
        for label, off in (OFFSETS[i] for i in cells):
            r = res[(m.name, label)]
            shown = ",".join(f"{x:.3f}" for x in dict.fromkeys(ratios(m, off).values()))
            echo(f"{m.name:7} {m.what:44} {label:>7} {shown:>8} {r.passed:8.3f} {r.failed:8.3f} "
                 f"{r.inconclusive:7.3f} {r.runs_mean:5.1f} {r.runs_p95:4g}")
    out: dict[str, float] = {}
    echo(f"# {args.trials} trials a cell, seed {args.seed}, swap gap {args.gap} runs, "
         + (f"within_gate_drift {args.within_gate_drift} in every cell, "
            if args.within_gate_drift else "")
         + (f"walk {args.walk:g} a run pair, " if args.walk != 0.005 else "")
         + (f"within_gate_walk {args.within_gate_walk:g} in every cell, "
            if args.within_gate_walk is not None else "")
         + (f"sim cell's C=8 runs correlated {args.sim_ar:g}, " if args.sim_ar is not None else "")
         + (f"run_correlation {args.run_correlation:g} in every cell, "
            if args.run_correlation is not None else "")
         + f"{time.monotonic() - t0:.0f} s")
    for mi in chosen:
        name = models()[mi].name
        if (name, "bar") not in res or (name, "equal") not in res:
            continue
        runs = [n for (nm, _), r in res.items() if nm == name for n in r.runs]
        ff, fp = res[(name, "bar")].failed, res[(name, "bar")].passed
        eq, rm = res[(name, "equal")].passed, sum(runs) / len(runs)
        out.update({f"{name}.false_fail": ff, f"{name}.false_pass": fp,
                    f"{name}.equal_pass": eq, f"{name}.runs_mean": rm})
        echo(f"gate_calibration: cell={name} false_fail={ff:.3f} false_pass={fp:.3f} "
             f"equal_pass={eq:.3f} runs_mean={rm:.1f}")
    if args.capacity_trials:
        cov, n = capacity_coverage(args.capacity_trials, args.seed)
        out["capacity_coverage"] = cov
        echo(f"gate_calibration: capacity_coverage={cov:.3f} capacity_requests={n} "
             f"trials={args.capacity_trials}")
    return out

if __name__ == "__main__":
    main()
