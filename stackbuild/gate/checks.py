"""The gate's checks beyond per-level throughput: output agreement, capacity under SLOs,
and the traffic-weighted change. Each returns its part of the GateResult."""

from __future__ import annotations

from typing import Any

from stackbuild.errors import InfraError
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
                     profile: GateProfile) -> AgreementResult | None:
    """Candidate's greedy outputs and likelihoods against the incumbent's (live or stored)."""
    n, tokens = profile.agreement_prompts, profile.agreement_tokens
    if n == 0:
        return None
    try:
        mine = await agreement.collect(url, profile.seed, n, tokens, profile.timeout_s)
        reference: tuple[Any, ...] = ()
        if inc_url:
            reference = await agreement.collect(inc_url, profile.seed, n, tokens, profile.timeout_s)
        elif baseline is not None and baseline.agreement is not None:
            reference = baseline.agreement.samples
        if reference and [r.prompt for r in reference] != [m.prompt for m in mine]:
            note = ("agreement: the baseline's stored outputs are of other prompts (seed or "
                    "agreement_prompts differ); not compared")
            return AgreementResult(prompts=n, tokens=tokens, samples=mine, reasons=(note,))
        if not reference:
            return AgreementResult(prompts=n, tokens=tokens, samples=mine)
        forced = await agreement.teacher_forced(url, reference, profile.timeout_s)
    except InfraError as err:
        return AgreementResult(prompts=n, tokens=tokens, passed=False,
                               reasons=(f"agreement: {err}",))
    return agreement.compare(reference, mine, forced,
                             min_first_token=profile.min_first_token_agreement,
                             max_drop=profile.max_logprob_drop)


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
