"""The gate's decisions, free of HTTP: judge a level, run its sequential loop, the overall verdict.

`run_level` takes the measurement as a function (`Take`: run index -> the candidate's run
and, with a live incumbent, the incumbent's run measured just before it), so the live gate
passes HTTP measurements and bench/gate_calibration.py passes a noise model, and both run
this same loop, `judge_level` and `overall`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Awaitable, Callable, Sequence
from itertools import pairwise
from typing import Any

from stackbuild.effects.prometheus import OTHER_CLIENTS
from stackbuild.gate.result import (
    AgreementResult,
    LevelResult,
    ProbeResult,
    RunMetrics,
    TrafficResult,
    Verdict,
)
from stackbuild.gate.sequential import Design, look
from stackbuild.gate.stats import allowed
from stackbuild.spec.profile import GateProfile

# run index -> (candidate's run, incumbent's run when it is live, else None)
Take = Callable[[int], Awaitable[tuple[RunMetrics, RunMetrics | None]]]


# the level of the slope test a swap's paired differences get under within_gate_drift "auto"
# (sequential.resolved). Chosen on bench/gate_calibration.py (1000 trials a cell): at 5% a drift
# of 0.5% a run slipped past the early looks (false pass 3.2%); at 10% the drift cell holds
# 1.9% / 1.4% with the users' equal builds passing 97.5% / 96.5% (users / users3); at 20%,
# 95.6% / 92.0%. The incumbent's reference is not tested on its own: a reference measured on a
# server just started trends with its warm-up, no drift of the machine (tested, it read an
# equal build 25% slower, -58%..+32%, in a fresh-clone CI)
TREND_TEST = 0.1


def design_for(profile: GateProfile, *, paired: bool, fresh: bool = False,
               mirrored: bool = False, gap: int = 0) -> Design:
    """The sequential design of a level: looks from `runs` (or the first run count where a
    boundary can be crossed, Design.start) to `max_runs`, the candidate's run i paired with the
    incumbent's run i on the same seeded prompts, live (`paired`: measured beside it, in ABBA
    order) or stored; a stored baseline carries the session drift unless it is `fresh` (measured
    in this session, right before a swap); the false-pass alpha
    per level (the gate passes only when every required level passes: an intersection-union
    test, Berger 1982, Technometrics 24:295), the false-fail alpha split over the required
    levels (any one failing fails the gate: Bonferroni). Where the profile declares
    `within_gate_drift: linear`, a fresh baseline `mirrored` (measured in `reference_order`,
    right before a swap) is compared by the detrended statistic (trend.detrended): a
    linear drift of the machine over the swap is removed, at about twice the standard error.
    By default ("none") it is compared plain, as any paired baseline."""
    wl = profile.workload()
    alpha = (1.0 - profile.confidence) / 2.0
    family = max(1, len(profile.required_levels()))
    auto = tests_trend(profile, paired=paired, fresh=fresh, mirrored=mirrored)
    return Design(paired=True, first=wl.runs, last=wl.max_runs, alpha_pass=alpha,
                  alpha_fail=alpha / family,
                  drift=0.0 if paired or fresh else profile.session_drift,
                  correlation=profile.run_correlation,
                  detrend=detrends(profile, paired=paired, fresh=fresh, mirrored=mirrored),
                  trend_test=TREND_TEST if auto else 0.0,
                  walk=profile.within_gate_walk if auto else 0.0,
                  gap=gap if is_swap(paired=paired, fresh=fresh, mirrored=mirrored) else 0).start()


def is_swap(*, paired: bool, fresh: bool, mirrored: bool) -> bool:
    """A swap's baseline: fresh, measured in mirror order and not live (a live incumbent
    alternates ABBA: a drift favours neither side)."""
    return fresh and mirrored and not paired


def detrends(profile: GateProfile, *, paired: bool, fresh: bool, mirrored: bool) -> bool:
    """Whether a level is always compared detrended: a swap's baseline (`is_swap`), the profile
    declaring a linear drift within the gate (`within_gate_drift: linear`)."""
    return profile.within_gate_drift == "linear" and is_swap(paired=paired, fresh=fresh,
                                                              mirrored=mirrored)


def tests_trend(profile: GateProfile, *, paired: bool, fresh: bool, mirrored: bool) -> bool:
    """Whether each look tests a swap's pairs for a trend first (`within_gate_drift: auto`,
    sequential.resolved)."""
    return profile.within_gate_drift == "auto" and is_swap(paired=paired, fresh=fresh,
                                                            mirrored=mirrored)


def reference_order(n: int) -> list[int]:
    """The run indices (prompt sets) of a reference measurement of n runs, in the order they are
    measured: the last first. The candidate's run i follows the swap in index order, so each
    pair (the two sides' run i) straddles the switch symmetrically, i + 1/2 runs either side
    (trend.mirror_separations), and a drift's linear part is told apart from the
    difference (trend.detrended)."""
    return list(range(n - 1, -1, -1))


def mirrored(runs: Sequence[RunMetrics]) -> bool:
    """Whether stored runs (in index order) were measured in `reference_order`: each started
    before the one of the index below it. Runs stored before start times were kept: no."""
    starts = [r.started for r in runs if r.started is not None]
    return len(starts) == len(runs) >= 2 and all(a > b for a, b in pairwise(starts))


def swap_gap(runs: Sequence[RunMetrics], now: float) -> int:
    """The runs' time between a mirrored reference's last run (index 0, measured last) ending
    and `now`, the candidate's first run starting: the swap's restart, in whole runs of the
    reference's mean duration (sequential.Design.gap). 0 without start times."""
    first = next((r for r in runs if r.index == 0), None)
    if first is None or first.started is None:
        return 0
    mean = sum(r.duration_s for r in runs) / len(runs)
    if mean <= 0:
        return 0
    return max(0, round((now - first.started - first.duration_s) / mean))


def level_summary(concurrency: int, runs: list[RunMetrics]) -> LevelResult:
    """A level's runs, in index order (a reference measures them in `reference_order`)."""
    return LevelResult(
        concurrency=concurrency,
        runs=tuple(sorted(runs, key=lambda r: r.index)),
        median_output_tok_s=statistics.median(r.output_tok_s for r in runs),
        median_total_tok_s=statistics.median(r.total_tok_s for r in runs),
        ttft_p99_ms=max(r.ttft_ms.p99 for r in runs),
        failed_requests=sum(r.failed for r in runs),
    )


def _pct(x: float) -> str:
    return f"{(x - 1) * 100:+.1f}%"


def interval_text(low: float, high: float, confidence: float | None) -> str:
    if not math.isfinite(high) or low <= 0:
        return "no interval yet: 2 runs a side needed"
    return f"{confidence or 0:.1%} CI {_pct(low)}..{_pct(high)}"


def explain(c: int, ratio: float, low: float, high: float, bar: float, verdict: Verdict,
            required: bool, *, margin: float = 0.0, confidence: float | None = 0.95) -> str:
    """One sentence per level: "C=1 -6.4% (95.0% CI -8.1%..-4.6%), allowed -8%: pass"."""
    word = {"inconclusive": "cannot tell yet"}.get(verdict, verdict)
    tail = "" if required else " (advisory: does not decide the gate)"
    return (f"C={c} {_pct(ratio)} ({interval_text(low, high, confidence)}), "
            f"{allowed(bar, margin)}: {word}{tail}")


def _broken(level: LevelResult, profile: GateProfile) -> list[str]:
    reasons = []
    if level.failed_requests > profile.max_failed_requests:
        errs = sorted({e for r in level.runs for e in r.errors})[:3]
        reasons.append(f"C={level.concurrency}: {level.failed_requests} failed requests "
                       f"(allowed {profile.max_failed_requests}): {'; '.join(errs)}")
    mismatched = sum(r.token_count_mismatches for r in level.runs)
    if mismatched:
        reasons.append(f"C={level.concurrency}: in {mismatched} requests the server's token "
                       "counts disagree with what it streamed; the tok/s cannot be trusted")
    return reasons


def judge_level(level: LevelResult, incumbent: list[float] | None, profile: GateProfile, *,
                final: bool, design: Design | None = None, live: bool = False) -> LevelResult:
    """Attach the comparison and verdict; 'inconclusive' only when final (no runs left).

    `design`: how the runs compare (default: against stored runs, the profile's looks);
    `live`: the incumbent's runs were measured beside the candidate's.
    """
    c = level.concurrency
    design = design or design_for(profile, paired=False)
    reasons = _broken(level, profile)
    verdict: Verdict = "fail" if reasons else "reference"
    broken = bool(reasons)
    fields: dict[str, Any] = {}
    bar, margin = profile.bar(c), profile.margin_at(c)
    pol = profile.policy(c)
    # failed requests and miscounted tokens decide at every level; the ratio only where required
    required = (pol.required and profile.decide_on == "levels") or broken
    if incumbent:
        fields.update(baseline_median_output_tok_s=statistics.median(incumbent),
                      baseline_runs_tok_s=tuple(incumbent), paired=live,
                      bar=bar, margin=margin)
        if min(incumbent) <= 0 or min(r.output_tok_s for r in level.runs) <= 0:
            reasons.append(f"C={c}: a run measured 0 tok/s; re-measure")
            verdict = "fail" if broken else "inconclusive"
        else:
            lk = look([r.output_tok_s for r in level.runs], incumbent, bar, design)
            conf = 1.0 - design.alpha_pass - design.alpha_fail
            shown = math.isfinite(lk.high) and lk.low > 0  # below 2 runs a side: no interval
            fields.update(ratio=lk.ratio, ci_low=lk.low if shown else None,
                          ci_high=lk.high if shown else None, ci_confidence=conf)
            ci = f"ratio {lk.ratio:.3f}, {interval_text(lk.low, lk.high, conf)}"
            policy = allowed(bar, margin)
            if lk.decision == "fail":
                reasons.append(f"C={c}: slower than the incumbent allows: {ci}, below {bar:.3f} "
                               f"({policy})")
                verdict = "fail"
            elif lk.decision == "undecided" and not broken:
                verdict = "inconclusive"
                if final:
                    reasons.append(f"C={c}: cannot tell after {len(level.runs)} runs: {ci} "
                                   f"straddles {bar:.3f} ({policy}); raise max_runs "
                                   "(`gate --plan` says how many this noise needs)")
            elif not broken:
                verdict = "pass"
            fields["explanation"] = explain(c, lk.ratio, lk.low, lk.high, bar, verdict,
                                            required and pol.required, margin=margin,
                                            confidence=conf)
    fields["required"] = required
    if not required:
        reasons = [f"{r} (advisory level)" for r in reasons]
    return level.model_copy(update={**fields, "verdict": verdict, "reasons": tuple(reasons)})


async def run_level(c: int, take: Take, profile: GateProfile, design: Design,
                    stored: list[float] | None, cand: list[RunMetrics] | None = None, *,
                    live: bool = False) -> LevelResult:
    """Runs at one level until the sequential test decides or its last look.

    A `live` incumbent is measured by `take` beside each candidate run; else
    the candidate is compared with `stored`, or measured alone (a reference: `baseline_runs()`
    runs, in `reference_order`).
    `cand` collects the candidate's runs as they finish (the deadline keeps what was measured).
    """
    cand = [] if cand is None else cand
    inc: list[float] = []
    compared = live or bool(stored)
    target = design.first if compared else max(design.first, profile.baseline_runs())
    allowed = profile.max_failed_requests
    order = list(range(max(target, design.last) + 1)) if compared else reference_order(target)
    while True:
        while len(cand) < target and sum(r.failed for r in cand) <= allowed:
            mine, theirs = await take(order[len(cand)])
            if theirs is not None:
                inc.append(theirs.output_tok_s)
            cand.append(mine)
        # failed requests past what the profile allows decide the level (judge_level fails it):
        # no more runs are measured
        broken = sum(r.failed for r in cand) > allowed
        final = broken or target >= design.last or not compared
        lv = judge_level(level_summary(c, cand), inc if live else stored, profile,
                         final=final, design=design, live=live)
        if lv.verdict != "inconclusive" or final:
            return lv
        target += 1


def overall(levels: list[LevelResult], bars: list[str], probe: ProbeResult | None,
            compared: bool, agreed: AgreementResult | None = None,
            traffic: TrafficResult | None = None, *, traffic_decides: bool = False) -> Verdict:
    """Fail on any deciding failure (a required level, a bar, the probe, agreement); else
    inconclusive when a required level (or the traffic verdict, when traffic decides) is."""
    deciding = [lv for lv in levels if lv.required]
    if agreed is not None and not agreed.passed:
        return "fail"
    if bars or (probe is not None and not probe.passed) or any(
            lv.verdict == "fail" for lv in deciding):
        return "fail"
    if traffic_decides and compared:
        said = traffic.verdict if traffic is not None else None
        if said != "pass":
            return said if said in ("fail", "inconclusive") else "inconclusive"
    if any(lv.verdict == "inconclusive" for lv in deciding):
        return "inconclusive"
    return "pass" if compared else "reference"


def bar_violations(levels: list[LevelResult], profile: GateProfile) -> list[str]:
    out = []
    c1 = next((lv for lv in levels if lv.concurrency == 1), None)
    if profile.min_tok_s_c1 is not None and c1 is not None \
            and c1.median_output_tok_s < profile.min_tok_s_c1:
        out.append(f"C=1 median {c1.median_output_tok_s:.1f} tok/s is below the bar "
                   f"{profile.min_tok_s_c1:g} tok/s")
    if profile.max_ttft_p99_ms is not None:
        for lv in levels:
            if lv.ttft_p99_ms > profile.max_ttft_p99_ms:
                out.append(f"C={lv.concurrency}: p99 TTFT {lv.ttft_p99_ms:.0f} ms exceeds "
                           f"{profile.max_ttft_p99_ms:g} ms")
    return out


def busy_notes(c: int, *, mine: int | None, theirs: int | None, live: bool, compared: bool) -> tuple[str, ...]:
    """What other clients did to a level's comparison: `mine`, requests of other clients the measured server
    finished during the level; `theirs`, the incumbent's (live, during the level; stored, during its runs).
    A server that serves others while it is measured reads slower than alone, so the other side gains: a
    busy incumbent flatters the candidate (bench/busy_incumbent.py: an equal build read +10.6% at C=1 beside
    an incumbent with 4 clients of its own). Said, not decided on: the verdict stays the numbers'."""
    out = []
    if compared and theirs:
        when = "during this level" if live else "while its stored runs were measured"
        out.append(f"C={c}: the incumbent finished {theirs} {OTHER_CLIENTS} {when}: a busy "
                   "incumbent reads slower, so the candidate gains; for a comparison on equal terms, gate "
                   "while the incumbent is quiet or drained from its gateway, or against a result of it measured quiet")
    if mine:
        gains = "the incumbent gains" if compared else "a candidate compared with this result gains"
        out.append(f"C={c}: the measured server finished {mine} {OTHER_CLIENTS} during this "
                   f"level: it reads slower than it would alone, so {gains}")
    return tuple(out)
