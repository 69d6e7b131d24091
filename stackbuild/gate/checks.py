"""The gate's checks beyond per-level throughput: output agreement, capacity under SLOs,
and the traffic-weighted change. Each returns its part of the GateResult."""

from __future__ import annotations

import math
from typing import Any

from stackbuild.gate import agreement, capacity, traffic
from stackbuild.gate.decide import design_for
from stackbuild.gate.result import (
    AgreementResult,
    CapacityComparison,
    CapacityResult,
    GateResult,
    LevelResult,
    TrafficResult,
    Verdict,
    Workload,
)
from stackbuild.gate.sequential import estimate
from stackbuild.gate.stats import allowed, t_isf
from stackbuild.spec.profile import GateProfile


async def agreement_check(url: str, inc_url: str | None, baseline: GateResult | None,
                          profile: GateProfile, deadline: float | None = None
                          ) -> AgreementResult | None:
    """Candidate's greedy outputs, texts and likelihoods against the incumbent's (live or
    stored), never past `deadline` (time.monotonic())."""
    return await agreement.run(url, inc_url, baseline, profile, deadline=deadline)


def judge_capacity(cand: CapacityResult, inc: CapacityResult | None,
                   required: bool) -> CapacityComparison:
    """Both sides' capacity; fails only when the profile requires capacity not to drop and the
    intervals say it did: the candidate's high end below the incumbent's low end."""
    if inc is None:
        return CapacityComparison(candidate=cand)
    ratio = cand.goodput_tok_s / inc.goodput_tok_s if inc.goodput_tok_s > 0 else None
    reasons = []
    cand_high = cand.concurrency if cand.concurrency_high is None else cand.concurrency_high
    inc_low = inc.concurrency if inc.concurrency_low is None else inc.concurrency_low
    if required and cand_high < inc_low:
        reasons.append(f"capacity under {_slo_text(cand.slo)}: {cand.interval_text()} "
                       f"({cand.goodput_tok_s:.1f} tok/s goodput) is below the incumbent's "
                       f"{inc.interval_text()} ({inc.goodput_tok_s:.1f} tok/s)")
    return CapacityComparison(candidate=cand, incumbent=inc, goodput_ratio=ratio,
                              passed=not reasons, reasons=tuple(reasons))


def traffic_verdict(levels: list[LevelResult], profile: GateProfile) -> TrafficResult | None:
    """Expected output throughput change on the profile's traffic weights, with its interval;
    a verdict against the profile's bar when traffic decides (`decide_on: traffic`)."""
    per = {}
    for lv in levels:
        if lv.baseline_runs_tok_s and lv.runs and min(lv.baseline_runs_tok_s) > 0 \
                and min(r.output_tok_s for r in lv.runs) > 0:
            design = design_for(profile, paired=bool(lv.paired))
            est, se, df = estimate([r.output_tok_s for r in lv.runs], lv.baseline_runs_tok_s,
                                   design)
            # a level that stopped early was looked at more than once: its se is widened so
            # that the fixed-sample t at `confidence` spans its repeated confidence interval
            # at that look (Jennison & Turnbull 2000, ch. 9), which holds whenever it stopped
            n = len(lv.runs)
            if n < design.last and df >= 1 and math.isfinite(se):
                wide = max(design.critical(n, len(lv.baseline_runs_tok_s)))
                se *= max(1.0, wide / t_isf((1.0 - profile.confidence) / 2.0, df))
            per[lv.concurrency] = (est, se, df)
    w = {c: x for c, x in profile.traffic.items() if c in per and x > 0}
    if not w:
        return None
    total = sum(w.values())
    w = {c: x / total for c, x in w.items()}
    change, low, high = traffic.weighted_change(per, w, confidence=profile.confidence)
    if profile.decide_on != "traffic":
        return TrafficResult(weights=w, change=change, ci_low=low, ci_high=high,
                             confidence=profile.confidence)
    bar = 1.0 - (profile.tolerance or profile.margin)
    margin = profile.margin if profile.tolerance == 0 else 0.0
    verdict: Verdict = "pass" if 1 + low >= bar else "fail" if 1 + high < bar else "inconclusive"
    mix = ", ".join(f"C={c} {x:.0%}" for c, x in sorted(w.items()))
    said = (f"on traffic ({mix}): expected {change:+.1%} ({profile.confidence:.0%} CI "
            f"{low:+.1%}..{high:+.1%}), {allowed(bar, margin)}: "
            f"{ {'inconclusive': 'cannot tell'}.get(verdict, verdict)}")
    return TrafficResult(weights=w, change=change, ci_low=low, ci_high=high,
                         confidence=profile.confidence, bar=bar, verdict=verdict,
                         explanation=said)


def _slo_text(slo: dict[str, float]) -> str:
    return ", ".join(f"{k}<={v:g}" for k, v in slo.items())


async def capacity_check(url: str, inc_url: str | None, baseline: GateResult | None,
                    profile: GateProfile, wl: Workload) -> CapacityComparison | None:
    if not profile.slo:
        return None
    top = profile.capacity_max_concurrency
    opts: dict[str, Any] = {"min_requests": profile.capacity_min_requests,
                            "confidence": profile.confidence}
    inc = None
    if inc_url:
        inc = await capacity.measure_capacity(inc_url, wl, profile.slo, top, **opts)
    elif baseline is not None and baseline.capacity is not None \
            and baseline.capacity.candidate.slo == profile.slo:
        inc = baseline.capacity.candidate
    cand = await capacity.measure_capacity(url, wl, profile.slo, top, **opts)
    return judge_capacity(cand, inc, profile.require_capacity)
