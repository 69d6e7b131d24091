"""The gate's checks beyond per-level throughput: output agreement, capacity under SLOs,
and the traffic-weighted change. Each returns its part of the GateResult."""

from __future__ import annotations

from stackbuild.gate import agreement, capacity, traffic
from stackbuild.gate.result import (
    AgreementResult,
    CapacityComparison,
    CapacityResult,
    GateResult,
    LevelResult,
    TrafficResult,
    Workload,
)
from stackbuild.spec.profile import GateProfile


async def agreement_check(url: str, inc_url: str | None, baseline: GateResult | None,
                          profile: GateProfile, deadline: float | None = None
                          ) -> AgreementResult | None:
    """Candidate's greedy outputs, texts and likelihoods against the incumbent's (live or
    stored), never past `deadline` (time.monotonic())."""
    return await agreement.run(url, inc_url, baseline, profile, deadline=deadline)


def judge_capacity(cand: CapacityResult, inc: CapacityResult | None,
                   required: bool) -> CapacityComparison:
    """Both sides' capacity; fails only when the profile requires capacity not to drop."""
    if inc is None:
        return CapacityComparison(candidate=cand)
    ratio = cand.goodput_tok_s / inc.goodput_tok_s if inc.goodput_tok_s > 0 else None
    reasons = []
    if required and cand.concurrency < inc.concurrency:
        reasons.append(f"capacity under {_slo_text(cand.slo)}: C={cand.concurrency} "
                       f"({cand.goodput_tok_s:.1f} tok/s goodput) is below the incumbent's "
                       f"C={inc.concurrency} ({inc.goodput_tok_s:.1f} tok/s)")
    return CapacityComparison(candidate=cand, incumbent=inc, goodput_ratio=ratio,
                              passed=not reasons, reasons=tuple(reasons))


def traffic_verdict(levels: list[LevelResult], profile: GateProfile) -> TrafficResult | None:
    """Expected output throughput change on the profile's traffic weights, with its CI."""
    per = {lv.concurrency: ([r.output_tok_s for r in lv.runs], list(lv.baseline_runs_tok_s))
           for lv in levels if lv.baseline_runs_tok_s}
    w = {c: x for c, x in profile.traffic.items() if c in per and x > 0}
    if not w:
        return None
    total = sum(w.values())
    w = {c: x / total for c, x in w.items()}
    change, low, high = traffic.weighted_change(per, w, confidence=profile.confidence,
                                                seed=profile.seed)
    return TrafficResult(weights=w, change=change, ci_low=low, ci_high=high,
                         confidence=profile.confidence)


def _slo_text(slo: dict[str, float]) -> str:
    return ", ".join(f"{k}<={v:g}" for k, v in slo.items())


async def capacity_check(url: str, inc_url: str | None, baseline: GateResult | None,
                    profile: GateProfile, wl: Workload) -> CapacityComparison | None:
    if not profile.slo:
        return None
    top = profile.capacity_max_concurrency
    inc = None
    if inc_url:
        inc = await capacity.measure_capacity(inc_url, wl, profile.slo, top)
    elif baseline is not None and baseline.capacity is not None \
            and baseline.capacity.candidate.slo == profile.slo:
        inc = baseline.capacity.candidate
    cand = await capacity.measure_capacity(url, wl, profile.slo, top)
    return judge_capacity(cand, inc, profile.require_capacity)
