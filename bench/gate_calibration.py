"""The gate's error rates, measured: its own decision code on synthetic runs, many times.

Imports and drives the real per-level judge (stackbuild.gate.decide.judge_level), the real
sequential run loop (decide.run_level: the measurement is injected, here a noise model)
and the real overall verdict (decide.overall), through stackbuild.gate.simulate.trial.
For each noise model and each true ratio candidate/incumbent -- at the bar, bar -5%,
-2%, +2%, +5%, and equal (1.0) -- it reports P(pass), P(fail), P(inconclusive) and the
mean and 95th percentile of the candidate's runs per level, over --trials trials a cell.

Models (stackbuild/gate/simulate.py says where each figure comes from):
  sim     the simulator's spread over HTTP, measured, its runs' autocorrelation included
          (lag-1 0.4 at C=8); the Done-when gate of issue 19: builtin `quick`,
          --concurrency 8,32 --tolerance 0 (must not lose: bar 1 - margin), live incumbent
          in alternation (paired), two required levels (family-wise)
  sim-ac  the same with the profile told the runs' autocorrelation (run_correlation 0.4)
  users   the users' spread at C=1 (5.4% a run); their real path, swap: the incumbent's
          10 runs stored from an earlier session (drift 1% between sessions, as the
          profile assumes), the candidate looked at from run 5 to 15; must not lose
  users3  the users' policy on their sweep: C=1 allowed -8%, C=30 and 250 must not lose,
          noise 5.4%/sqrt(C) (an assumption: acceptance noise averages over C streams),
          stored baseline of 10 runs; every level at its own bar (+ the offset)
  drift   the simulator's spread at C=32 against a baseline stored in another session
          that drifted by 1% (sd) and drifts within a session (0.3% a run)

Last line (false_fail, false_pass: users at the bar; equal_pass: sim, equal builds;
runs: users, all its cells):
`gate_calibration: false_fail=... false_pass=... equal_pass=... runs_mean=... runs_p95=...`
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

from stackbuild.gate.simulate import SIM_NOISE, USERS_NOISE, Noise, Rates, p95, rates
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


def models() -> list[Model]:
    quick = BUILTIN_PROFILES["quick"].with_overrides(concurrency=(8, 32), tolerance=0.0)
    users = BUILTIN_PROFILES["users"].with_overrides(tolerance=0.0)
    sweep = users.with_overrides(levels={1: LevelPolicy(tolerance=0.08)})
    return [
        Model("sim", "C=8,32 must not lose, live (paired)", SIM_NOISE, quick, stored=False),
        Model("sim-ac", "the same, run_correlation 0.4", SIM_NOISE,
              quick.with_overrides(run_correlation=0.4), stored=False),
        Model("users", "C=1 must not lose, stored 10 runs", replace(USERS_NOISE, session=0.01),
              users.with_overrides(concurrency=(1,)), stored=True, stored_runs=10),
        Model("users3", "C=1 -8%, C=30,250 must not lose, stored 10",
              Noise("users3", {c: USERS_NOISE.at(1) / c ** 0.5 for c in (1, 30, 250)},
                    session=0.01), sweep, stored=True, stored_runs=10),
        Model("drift", "C=32 must not lose, stored 10, drifted", Noise(
            "drift", {32: SIM_NOISE.at(32)}, ar=SIM_NOISE.ar, walk=0.003, session=0.01),
            quick.with_overrides(concurrency=(32,)), stored=True, stored_runs=10),
    ]


def ratios(m: Model, offset: float | None) -> dict[int, float]:
    return {c: 1.0 if offset is None else m.profile.bar(c) * (1.0 + offset)
            for c in m.profile.concurrency}


def cell(args: tuple[int, int, int, int]) -> Rates:
    mi, oi, trials, seed = args
    m = models()[mi]
    return rates(m.profile, m.noise, ratios(m, OFFSETS[oi][1]), stored=m.stored,
                 stored_runs=m.stored_runs, trials=trials, seed=seed + 1000 * mi + oi)


def main(argv: list[str] | None = None, echo: Callable[[str], None] = print) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2000, help="trials per cell (default 2000)")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--models", default="sim,sim-ac,users,users3,drift", help="comma-separated subset")
    ap.add_argument("--cells", default=",".join(k for k, _ in OFFSETS),
                    help="comma-separated subset of the true ratios: bar-5%%,bar-2%%,bar,bar+2%%,bar+5%%,equal")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    chosen = [i for i, m in enumerate(models()) if m.name in args.models.split(",")]
    cells = [i for i, (k, _) in enumerate(OFFSETS) if k in args.cells.split(",")]
    jobs = [(mi, oi, args.trials, args.seed) for mi in chosen for oi in cells]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            got = list(pool.map(cell, jobs))
    else:
        got = [cell(j) for j in jobs]
    res = {(models()[mi].name, OFFSETS[oi][0]): r for (mi, oi, _, _), r in zip(jobs, got, strict=True)}
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
    if ("users", "bar") in res and ("sim", "equal") in res:
        runs = [n for (name, _), r in res.items() if name == "users" for n in r.runs]
        out = {"false_fail": res[("users", "bar")].failed, "false_pass": res[("users", "bar")].passed,
               "equal_pass": res[("sim", "equal")].passed, "runs_mean": sum(runs) / len(runs),
               "runs_p95": p95(runs)}
        echo(f"# {args.trials} trials a cell, seed {args.seed}, {time.monotonic() - t0:.0f} s")
        echo(f"gate_calibration: false_fail={out['false_fail']:.3f} false_pass={out['false_pass']:.3f} "
             f"equal_pass={out['equal_pass']:.3f} runs_mean={out['runs_mean']:.1f} "
             f"runs_p95={out['runs_p95']:g}")
    return out


if __name__ == "__main__":
    main()
