"""`gate --plan`: how long a gate will take, before it starts.

The noise comes from earlier results (the ledger's): each level's run-to-run spread (the
pooled sd of log tok/s within a result's runs), its run time, and the drift between
sessions (the spread of one configuration's level medians across results, less what the
run-to-run spread explains). The run counts come from the gate's own sequential loop on
that noise (stackbuild.gate.simulate): for an equal candidate and for one exactly at the
bar. The duration adds each phase's estimate: the levels (both sides when the incumbent
is live), the probe, agreement and capacity; the worst case is the gate's deadline.

`noise_from` and `plan_text` are pure but for the seeded simulation.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise

from stackbuild.gate import agreement
from stackbuild.gate.decide import TREND_TEST, design_for, detrends, tests_trend
from stackbuild.gate.result import GateResult
from stackbuild.gate.simulate import Noise, trial
from stackbuild.gate.trend import walk_seen
from stackbuild.spec.profile import GateProfile

# the spread assumed at a level no result has measured: about the simulator's (1.1-1.4%
# a side, measured) rounded up
ASSUMED_SIGMA = 0.02


@dataclass(frozen=True)
class LevelNoise:
    sigma: float  # sd of log tok/s per run, one side
    runs: int  # runs it is estimated from (0: assumed)
    run_s: float | None  # mean seconds of one run of this workload
    tok_s: float | None = None  # median output tok/s seen


@dataclass(frozen=True)
class NoiseSeen:
    levels: dict[int, LevelNoise]
    drift: float | None  # session-to-session sd of log tok/s, None when not measurable
    results: int  # results of this workload it comes from
    # lag-1 autocorrelation of successive runs (of the paired differences where the incumbent
    # ran live, else of the candidate's runs), pooled; None below 20 pairs of runs
    correlation: float | None = None
    # the random walk of the machine the swaps' pairs showed, as a ratio of a pair's variance
    # a run (trend.walk_seen), and the pairs it comes from; None without a swap of 4 pairs
    walk: float | None = None
    walk_pairs: int = 0


def _log_sd(xs: list[float]) -> tuple[float, int]:
    """(sum of squared deviations of the logs, degrees of freedom)."""
    logs = [math.log(x) for x in xs if x > 0]
    if len(logs) < 2:
        return 0.0, 0
    m = sum(logs) / len(logs)
    return sum((x - m) ** 2 for x in logs), len(logs) - 1


def noise_from(results: Iterable[GateResult], profile: GateProfile) -> NoiseSeen:
    """The noise earlier results of this profile's workload (same fingerprint) have shown."""
    fp = profile.workload().fingerprint()
    mine = [r for r in results if r.fingerprint == fp]
    ss: dict[int, float] = defaultdict(float)
    df: dict[int, int] = defaultdict(int)
    secs: dict[int, list[float]] = defaultdict(list)
    rates: dict[int, list[float]] = defaultdict(list)
    medians: dict[tuple[str, str, int], list[tuple[float, int]]] = defaultdict(list)
    lag = [0.0, 0.0, 0]  # sum of products of successive deviations, sum of squares, pairs
    swaps: list[tuple[list[float], int]] = []
    for r in mine:
        host = ",".join(f"{k}={r.host.get(k, '')}" for k in ("gpu_model", "gpu_count", "driver"))
        for lv in r.levels:
            for xs in ([x.output_tok_s for x in lv.runs], list(lv.baseline_runs_tok_s)):
                s, d = _log_sd(xs)
                ss[lv.concurrency] += s
                df[lv.concurrency] += d
            _lag1([x.output_tok_s for x in lv.runs],
                  list(lv.baseline_runs_tok_s) if lv.paired else [], lag)
            if lv.swap_gap is not None:  # run i against the incumbent's run i, measured right before
                both = zip((x.output_tok_s for x in lv.runs), lv.baseline_runs_tok_s, strict=False)
                swaps.append(([math.log(x / b) for x, b in both if x > 0 and b > 0], lv.swap_gap))
            secs[lv.concurrency] += [x.duration_s for x in lv.runs]
            rates[lv.concurrency] += [x.output_tok_s for x in lv.runs]
            if lv.runs and lv.median_output_tok_s > 0:
                medians[(r.name, host, lv.concurrency)].append(
                    (math.log(lv.median_output_tok_s), len(lv.runs)))
    levels = {}
    for c in profile.concurrency:
        sigma = math.sqrt(ss[c] / df[c]) if df[c] else ASSUMED_SIGMA
        run_s = sum(secs[c]) / len(secs[c]) if secs[c] else None
        tok_s = sorted(rates[c])[len(rates[c]) // 2] if rates[c] else None
        levels[c] = LevelNoise(sigma=sigma, runs=df[c], run_s=run_s, tok_s=tok_s)
    between, pairs = 0.0, 0
    for (_, _, c), ms in medians.items():
        if len(ms) >= 2:
            mean = sum(m for m, _ in ms) / len(ms)
            within = sum(levels[c].sigma ** 2 / n for _, n in ms) / len(ms) if c in levels else 0.0
            between += sum((m - mean) ** 2 for m, _ in ms) - (len(ms) - 1) * within
            pairs += len(ms) - 1
    drift = math.sqrt(max(0.0, between / pairs)) if pairs else None
    corr = lag[0] / lag[1] if lag[2] >= 20 and lag[1] > 0 else None
    walk, walk_pairs = walk_seen(swaps)
    return NoiseSeen(levels=levels, drift=drift, results=len(mine), correlation=corr,
                     walk=walk if walk_pairs else None, walk_pairs=walk_pairs)


def _lag1(cand: list[float], inc: list[float], acc: list[float]) -> None:
    """Add one level's successive-run products to `acc` (the differences when paired)."""
    xs = [math.log(c / i) for c, i in zip(cand, inc, strict=False)] if inc else \
        [math.log(c) for c in cand if c > 0]
    if len(xs) < 3:
        return
    m = sum(xs) / len(xs)
    dev = [x - m for x in xs]
    acc[0] += sum(a * b for a, b in pairwise(dev))
    acc[1] += sum(d * d for d in dev)
    acc[2] += len(xs) - 1


def undecidable(profile: GateProfile, *, stored: bool, fresh: bool) -> str | None:
    """Why this configuration cannot reach its bar however many runs it takes, or None.

    A stored baseline of another session carries the session drift in every interval: a
    floor under the standard error that no run count removes. Where c * floor (c the pass
    boundary at the last look) reaches the distance from an equal build to the bar, an equal
    build can never pass: the gate would spend max_runs and end inconclusive."""
    if not stored or fresh:
        return None
    design = design_for(profile, paired=False, fresh=False)
    floor = design.drift
    if floor <= 0:
        return None
    c_pass = design.critical(design.last, 0)[0]
    stuck = [c for c in profile.required_levels() if profile.bar(c) < 1.0
             and c_pass * floor >= -math.log(profile.bar(c))]
    if not stuck:
        return None
    need = max(1.0 - math.exp(-c_pass * floor * 1.05), 0.0)
    levels = ",".join(map(str, stuck))
    return (f"C={levels} cannot be decided against a stored baseline of another session: its "
            f"session drift of {floor:.1%} (session_drift) is a floor under the standard error "
            f"that no number of runs removes, and {c_pass:.2f} x {floor:.1%} reaches the distance "
            f"from an equal build to the bar ({', '.join(f'{profile.bar(c):.3f}' for c in stuck)}); "
            "make it decidable with a live incumbent (--baseline-url), a fresh measurement of "
            "the incumbent (within fresh_baseline_s; a swap deploy measures it right before it "
            f"stops it), a margin or tolerance of {need:.1%} or more, or a smaller "
            "session_drift (`gate --plan` shows the drift seen)")


@dataclass(frozen=True)
class LevelPlan:
    concurrency: int
    equal_runs: float  # mean candidate runs for an equal candidate
    equal_p95: float
    bar_runs: float  # for a candidate exactly at the bar
    equal_pass: float  # P(pass) of an equal candidate


def expected_runs(profile: GateProfile, noise: NoiseSeen, *, stored: bool, trials: int = 200,
                  seed: int = 0, fresh: bool = True) -> list[LevelPlan]:
    """Run counts per level from the gate's own loop on this noise, the runs' correlation the
    ledger showed included."""
    rho = min(0.8, max(0.0, noise.correlation or 0.0))
    model = Noise("seen", {c: lv.sigma for c, lv in noise.levels.items()},
                  ar={c: rho for c in noise.levels}, session=noise.drift or 0.0)
    stored_runs = profile.baseline_runs()
    out: dict[str, list[list[int]]] = {}
    passed = 0
    for case in ("equal", "bar"):
        ratios = {c: 1.0 if case == "equal" else profile.bar(c) for c in profile.concurrency}
        rng = random.Random(seed)
        got = [trial(profile, model, ratios, stored=stored, stored_runs=stored_runs, rng=rng,
                     fresh=fresh) for _ in range(trials)]
        out[case] = [[len(lv.runs) for lv in t.levels] for t in got]
        if case == "equal":
            passed = sum(t.verdict == "pass" for t in got)
    plans = []
    for i, c in enumerate(profile.concurrency):
        eq = sorted(r[i] for r in out["equal"])
        plans.append(LevelPlan(c, sum(eq) / len(eq), float(eq[min(len(eq) - 1, math.ceil(0.95 * len(eq)) - 1)]),
                               sum(r[i] for r in out["bar"]) / trials, passed / trials))
    return plans


def agreement_cost(profile: GateProfile, noise: NoiseSeen, *, stored: bool) -> tuple[int, float | None]:
    """(requests, seconds) the agreement check takes (agreement.cost) at the tok/s each level
    showed; seconds None while no earlier result measured them."""
    rates = {c: lv.tok_s for c, lv in noise.levels.items() if lv.tok_s}
    est = agreement.cost(profile, rates or 1.0, live_incumbent=not stored)
    return est.requests, est.seconds if rates else None


def phases(profile: GateProfile, noise: NoiseSeen, levels: list[LevelPlan], *,
           stored: bool) -> dict[str, float | None]:
    """Each phase's expected seconds for an equal build (None: not estimable yet)."""
    sides = 1 if stored else 2
    out: dict[str, float | None] = {}
    runs = [lp.equal_runs * sides * ln.run_s if (ln := noise.levels[lp.concurrency]).run_s
            is not None else None for lp in levels]
    out["levels"] = None if None in runs else sum(r or 0.0 for r in runs)
    if profile.agreement_prompts:
        out["agreement"] = agreement_cost(profile, noise, stored=stored)[1]
    if profile.slo:
        out["capacity"] = None  # depends on where the SLO breaks; bounded by the deadline
    return out


def _dur(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 5400 else f"{s / 60:.0f} min" if s >= 90 else f"{s:.0f} s"


def plan_text(profile: GateProfile, noise: NoiseSeen, *, stored: bool, name: str = "",
              trials: int = 200, fresh: bool = True) -> str:
    """What the gate will take, in lines a person reads before starting it.

    stored and fresh: the incumbent measured right before the swap (what a deploy does while
    it serves); stored and not fresh: a baseline of another session."""
    wl = profile.workload()
    stuck = undecidable(profile, stored=stored, fresh=fresh)
    if stuck:
        return f"gate plan{' ' + name if name else ''}: undecidable: {stuck}"
    levels = expected_runs(profile, noise, stored=stored, trials=trials, fresh=fresh)
    how = ("against the incumbent measured right before the swap, on the same prompts"
           if stored and fresh else "against a stored baseline of another session" if stored
           else "against a live incumbent, alternating")
    src = (f"the noise {noise.results} earlier results of this workload showed" if noise.results
           else f"no earlier result of this workload: an assumed {ASSUMED_SIGMA:.0%} spread a run")
    lines = [f"gate plan{' ' + name if name else ''}: C={','.join(map(str, wl.concurrency))}, "
             f"{wl.input_len} in / {wl.output_len} out, runs {wl.runs}..{wl.max_runs} a level, "
             f"{how}; at {src}"]
    for lp in levels:
        ln = noise.levels[lp.concurrency]
        run = f"{_dur(ln.run_s)} a run" if ln.run_s is not None else "run time not yet measured"
        lines.append(f"  C={lp.concurrency}: spread {ln.sigma:.1%} a run; an equal build takes "
                     f"~{lp.equal_runs:.1f} runs (p95 {lp.equal_p95:g}), one at the bar "
                     f"~{lp.bar_runs:.1f}; {run}")
    lines.append(f"  an equal build passes {levels[0].equal_pass:.0%} of the time at this noise"
                 + (f"; session drift seen {noise.drift:.1%}" if noise.drift is not None else ""))
    if detrends(profile, paired=not stored, fresh=fresh, mirrored=stored):
        lines.append("  compared detrended (within_gate_drift: linear): a linear drift over the "
                     "swap is removed, at a standard error about twice the plain one")
    elif tests_trend(profile, paired=not stored, fresh=fresh, mirrored=stored):
        lines.append("  compared plain unless the paired runs trend with time over the swap "
                     f"(slope test at {TREND_TEST:.0%}), then detrended (within_gate_drift: auto)"
                     + (f"; plain, allowing for a random walk of {profile.within_gate_walk:g} of a "
                        "pair's variance a run (within_gate_walk)" if profile.within_gate_walk else ""))
    if stored and fresh and undecidable(profile, stored=True, fresh=False):
        lines.append("  if the incumbent is not serving at the swap, its stored result of another "
                     "session is all there is, and then: " + str(undecidable(profile, stored=True,
                                                                            fresh=False)))
    if noise.correlation is not None and noise.correlation > profile.run_correlation + 0.1:
        lines.append(f"  successive runs were correlated {noise.correlation:.2f} (the profile assumes "
                     f"{profile.run_correlation:g}): set run_correlation (gate --run-correlation) to keep the "
                     "stated errors, or make the runs longer (more requests a run: min_requests) "
                     "than the machine's slow states last")
    if noise.walk is not None and stored and fresh:
        lines.append(f"  the swaps' pairs showed a random walk of {noise.walk:.3g} of a pair's variance a run "
                     f"({noise.walk_pairs} pairs; the profile allows for {profile.within_gate_walk:g})"
                     + (": set within_gate_walk to keep the stated errors"
                        if noise.walk > profile.within_gate_walk else ""))
    if profile.agreement_prompts:
        requests, secs = agreement_cost(profile, noise, stored=stored)
        parts = ", ".join(f"{p.name} {p.prompts}" for p in agreement.plan(profile))
        lines.append(f"  agreement: {requests} requests ({parts} prompts a side)"
                     + (f", ~{_dur(secs)}" if secs is not None else ""))
    est = phases(profile, noise, levels, stored=stored)
    said = ", ".join(f"{k} {'?' if v is None else _dur(v)}" for k, v in est.items())
    known = [v for v in est.values() if v is not None]
    total = f"~{_dur(sum(known))}" + ("" if len(known) == len(est) else " and more") if known \
        else "unknown until a run of this workload is measured"
    lines.append(f"  expected: {total} ({said}); never more than the deadline, "
                 f"{_dur(profile.gate_deadline_s())}")
    return "\n".join(lines)
