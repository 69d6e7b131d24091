"""run_gate: measure a candidate (and a live incumbent), decide per level, apply bars and probe.

With a live incumbent the two are measured in alternation, in ABBA order (incumbent then
candidate, then candidate then incumbent, ...) so slow drifts of the machine hit both alike
and a steady trend favours neither, and compared run by run (stackbuild.gate.sequential).
Every phase (readiness, warmup, levels, probe, agreement, capacity) runs within the whole
gate's deadline: what it cuts fails with that cause.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from stackbuild.effects import aio, http
from stackbuild.effects.prometheus import finished_requests, outside_requests
from stackbuild.effects.readiness import HttpProbe, wait_ready
from stackbuild.errors import InfraError, InputError
from stackbuild.gate import checks, loadgen
from stackbuild.gate.decide import (
    bar_violations,
    busy_notes,
    design_for,
    is_swap,
    level_summary,
    mirrored,
    overall,
    run_level,
    swap_gap,
)
from stackbuild.gate.probe import run_probe
from stackbuild.gate.result import (
    AgreementResult,
    CapacityComparison,
    CapacityResult,
    GateResult,
    LevelResult,
    ProbeResult,
    RunMetrics,
    Workload,
    age_s,
)
from stackbuild.spec.profile import GateProfile

Progress = Callable[[str, dict[str, Any]], None]
T = TypeVar("T")


class _Clock:
    """The whole gate's deadline: what each phase may still take."""

    def __init__(self, total_s: float) -> None:
        self.total_s = total_s
        self.end = time.monotonic() + total_s

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def cause(self) -> str:
        return f"the gate's deadline of {self.total_s:g}s passed"

    async def within(self, work: Awaitable[T]) -> T | None:
        """`work`'s result, or None when the deadline passes first (the work is cancelled)."""
        try:
            return await asyncio.wait_for(work, timeout=self.left())
        except TimeoutError:
            return None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _noop(kind: str, data: dict[str, Any]) -> None:
    return None


# _reachable and host_facts block the event loop on purpose: they run before any load task
# exists, so there is nothing to starve, and no worker thread is left behind when a
# SIGTERM interrupts the gate there.
def _reachable(url: str, what: str, deadline_s: float) -> None:
    """Port open, /health 200 and one generation, else InfraError (exit 4) naming the layer."""
    if not http.port_open(url, max(0.1, min(3.0, deadline_s))):
        raise InfraError(f"{what} {url} is unreachable (connection refused or timed out); "
                         "start the server or fix --url")
    ready = wait_ready(HttpProbe(url), start_deadline_s=deadline_s)
    if not ready.ok:
        raise InfraError(f"{what} {url} does not serve: {ready.stage} failing ({ready.detail}); "
                         "check the server's log")


def host_facts(url: str) -> dict[str, str]:
    try:
        reply = http.get(url.rstrip("/") + "/server_info")
        info = reply.json() if reply.status == 200 else None
    except (http.HttpFailure, ValueError):
        return {}
    if not isinstance(info, dict):
        return {}
    keys = ("version", "model_path", "served_model_name", "tp_size", "speculative_algorithm",
            "speculative_eagle_topk", "speculative_num_steps", "max_running_requests")
    facts = {f"sglang.{k}": str(info[k]) for k in keys if info.get(k) is not None}
    sim = info.get("sim")
    if isinstance(sim, dict):
        facts.update({f"sim.{k}": str(v) for k, v in sim.items() if v is not None})
    return facts


def is_fresh(baseline: GateResult, profile: GateProfile) -> bool:
    """A stored baseline of this session: finished at most `fresh_baseline_s` ago."""
    age = age_s(baseline)
    return age is not None and age <= profile.fresh_baseline_s


def _check_baseline(baseline: GateResult, wl: Workload, profile: GateProfile) -> None:
    """Refuse, before anything is measured, a stored baseline that cannot decide: another
    workload, fewer runs than the candidate may take (each candidate run i is paired with the
    incumbent's run i on the same prompts), or one whose session drift no run count can get
    below the margin."""
    if baseline.fingerprint != wl.fingerprint():
        raise InputError(
            f"--baseline: {baseline.name!r} measured workload {baseline.fingerprint}, this gate "
            f"measures {wl.fingerprint()} (lengths, api, seed or model differ); "
            "re-measure the incumbent with the same profile"
        )
    need = profile.baseline_runs()
    thin = [f"C={lv.concurrency} ({len(lv.runs)})" for c in wl.concurrency
            if (lv := baseline.level(c)) is not None and len(lv.runs) < need]
    if thin:
        raise InputError(
            f"--baseline: {baseline.name!r} has fewer than the {need} runs a baseline needs at "
            f"{', '.join(thin)} (its gate decided early); re-measure the incumbent: "
            f"stackbuild gate --url INCUMBENT --json FILE with this profile")
    from stackbuild.gate.plan import undecidable

    said = undecidable(profile, stored=True, fresh=is_fresh(baseline, profile))
    if said:
        raise InputError(f"--baseline: {said}")


async def _measure(url: str, wl: Workload, c: int, index: int, side: str,
                   progress: Progress, fail_after: int | None = None) -> RunMetrics:
    done = 0

    def tick(rec: loadgen.RequestRecord) -> None:
        nonlocal done
        done += 1
        progress("request", {"side": side, "concurrency": c, "index": index, "done": done,
                             "total": loadgen.requests_per_run(wl, c), "ok": rec.ok})

    run = await loadgen.run_once(url, wl, c, index, on_done=tick, fail_after=fail_after)
    progress("run", {"side": side, "concurrency": c, "index": index, "metrics": run})
    return run


async def _run_level(
    c: int, url: str, inc_url: str | None, stored: LevelResult | None, wl: Workload,
    profile: GateProfile, emit: Progress, done: list[RunMetrics] | None = None,
    fresh: bool = False,
) -> LevelResult:
    """One level measured over HTTP: the sequential loop (decide.run_level) with its runs taken here.

    `done` collects the candidate's runs as they finish (the deadline keeps what was measured).
    """
    done = [] if done is None else done
    allowed = profile.max_failed_requests
    sent_inc = 0  # requests the gate sent the live incumbent at this level

    async def take(i: int) -> tuple[RunMetrics, RunMetrics | None]:
        nonlocal sent_inc
        # failed requests past what the profile allows fail the level: the candidate's run
        # stops at the first one over (fail fast on a stall), and run_level measures no more
        def cand() -> Coroutine[Any, Any, RunMetrics]:
            return _measure(url, wl, c, i, "candidate", emit,
                            fail_after=allowed - sum(r.failed for r in done))
        # ABBA: the incumbent first in even pairs, the candidate first in odd ones, so a
        # machine that warms up or slows down over the gate favours neither side
        if inc_url is None:
            return await cand(), None
        if i % 2:
            mine = await cand()
            theirs = await _measure(inc_url, wl, c, i, "incumbent", emit)
        else:
            theirs = await _measure(inc_url, wl, c, i, "incumbent", emit)
            mine = await cand()
        sent_inc += theirs.completed + theirs.failed
        return mine, theirs

    # run i of the candidate is paired with the stored run of index i, whatever order it was
    # measured in; one measured in reference_order right before a swap is compared detrended
    # when the profile says within_gate_drift: linear (decide.detrends)
    kept = sorted(stored.runs, key=lambda r: r.index) if stored is not None else []
    stored_runs = [r.output_tok_s for r in kept] if stored is not None else None
    mirror = mirrored(kept)
    design = design_for(profile, paired=inc_url is not None, fresh=fresh, mirrored=mirror,
                        gap=swap_gap(kept, time.time()))
    before = await asyncio.gather(_finished(url), _finished(inc_url))
    lv = await run_level(c, take, profile, design, stored_runs, done, live=inc_url is not None)
    after = await asyncio.gather(_finished(url), _finished(inc_url))
    mine = outside_requests(before[0], after[0], sum(r.completed + r.failed for r in done))
    theirs = outside_requests(before[1], after[1], sent_inc)
    notes = busy_notes(c, mine=mine, theirs=theirs if inc_url else stored.outside_requests if stored else None,
                       live=inc_url is not None, compared=inc_url is not None or stored is not None)
    swap = is_swap(paired=inc_url is not None, fresh=fresh, mirrored=mirror)
    return lv.model_copy(update={"outside_requests": mine, "incumbent_outside_requests": theirs,
                                 "reasons": (*lv.reasons, *notes), "swap_gap": design.gap if swap else None})


async def _finished(url: str | None) -> float | None:
    """The server's count of finished requests from its /metrics; None without one (no --enable-metrics)."""
    if url is None:
        return None
    try:
        reply = await asyncio.to_thread(http.get, url + "/metrics", timeout=5.0)
    except InfraError:
        return None
    if reply.status != 200:
        return None
    return finished_requests(reply.body.decode("utf-8", errors="replace"))


async def _level_by_deadline(c: int, clock: _Clock, done: list[RunMetrics],
                             level: Coroutine[Any, Any, LevelResult]) -> LevelResult:
    """The level's result, or a failed level when the whole gate's deadline passes first."""
    lv = await clock.within(level)
    if lv is not None:
        return lv
    cause = f"C={c}: {clock.cause()} before this level finished"
    if done:
        return level_summary(c, done).model_copy(update={"verdict": "fail", "reasons": (cause,)})
    return LevelResult(concurrency=c, runs=(), median_output_tok_s=0.0, median_total_tok_s=0.0,
                       ttft_p99_ms=0.0, failed_requests=0, verdict="fail", reasons=(cause,))


async def _probe(url: str, inc_url: str | None, baseline: GateResult | None,
                 profile: GateProfile) -> ProbeResult:
    """Candidate's greedy outputs vs the live incumbent's, else the stored ones, else golden.

    With output agreement on, the incumbent's texts are not compared exactly (agreement
    judges that, tolerating benign divergence); the probe still catches degenerate text."""
    reference: tuple[str, ...] | None = profile.probe_golden or None
    if profile.agreement_prompts > 0:
        return await run_probe(url, profile.probe_prompts, profile.probe_max_tokens,
                               reference=reference, model=profile.model)
    if inc_url:
        inc = await run_probe(inc_url, profile.probe_prompts, profile.probe_max_tokens,
                              reference=None, model=profile.model)
        reference = inc.outputs or None
    elif baseline is not None and baseline.probe is not None and baseline.probe.outputs:
        reference = baseline.probe.outputs
    return await run_probe(url, profile.probe_prompts, profile.probe_max_tokens,
                           reference=reference, model=profile.model)


def _cut_agreement(profile: GateProfile, cause: str) -> AgreementResult:
    return AgreementResult(prompts=profile.agreement_prompts, tokens=profile.agreement_tokens,
                           passed=False, reasons=(f"agreement: {cause} before it finished",))


def _cut_capacity(profile: GateProfile, cause: str) -> CapacityComparison:
    cand = CapacityResult(slo=profile.slo, concurrency=0, tried=(f"{cause}",))
    return CapacityComparison(candidate=cand, passed=False,
                              reasons=(f"capacity: {cause} before the search finished",))


def _admit(url: str, profile: GateProfile, wl: Workload, clock: _Clock,
           baseline: GateResult | None, baseline_url: str | None) -> tuple[str | None, bool]:
    """Refuse what cannot be gated, before anything is measured; (the live incumbent's url,
    whether the stored baseline is fresh). Both servers must answer."""
    if baseline is not None and baseline_url is not None:
        raise InputError("give either --baseline FILE or --baseline-url URL, not both")
    if profile.decide_on == "traffic" and not profile.traffic:
        raise InputError("decide_on traffic needs traffic weights: pass --traffic FILE (written by "
                         "`stackbuild traffic`) or set traffic: in the profile")
    fresh = False
    if baseline is not None:
        _check_baseline(baseline, wl, profile)
        fresh = is_fresh(baseline, profile)
    _reachable(url, "candidate", min(profile.ready_timeout_s, clock.left()))
    inc_url = baseline_url.rstrip("/") if baseline_url else None
    if inc_url:
        _reachable(inc_url, "incumbent", min(profile.ready_timeout_s, clock.left()))
    return inc_url, fresh


async def _levels(url: str, inc_url: str | None, baseline: GateResult | None, wl: Workload,
                  profile: GateProfile, emit: Progress, clock: _Clock,
                  fresh: bool) -> list[LevelResult]:
    """Warm both servers up, then every level in turn, each within the gate's deadline."""
    for target in [u for u in (inc_url, url) if u]:
        await clock.within(loadgen.warmup(target, wl, max(wl.concurrency)))
    levels: list[LevelResult] = []
    for c in wl.concurrency:
        emit("level", {"concurrency": c})
        stored = baseline.level(c) if baseline is not None else None
        done: list[RunMetrics] = []
        lv = await _level_by_deadline(c, clock, done,
                                      _run_level(c, url, inc_url, stored, wl, profile, emit, done,
                                                 fresh))
        if baseline is not None and stored is None:
            note = f"C={c}: the baseline file has no runs at this level"
            lv = lv.model_copy(update={"reasons": (*lv.reasons, note)})
        emit("decision", {"concurrency": c, "level": lv})
        levels.append(lv)
    return levels


async def _checks(url: str, inc_url: str | None, baseline: GateResult | None, wl: Workload,
                  profile: GateProfile, emit: Progress, clock: _Clock,
                  ) -> tuple[ProbeResult, AgreementResult | None, CapacityComparison | None]:
    """The probe, the output agreement and the capacity check, each cut by the deadline."""
    probe = await clock.within(_probe(url, inc_url, baseline, profile))
    if probe is None:
        probe = ProbeResult(passed=False, reasons=(f"probe: {clock.cause()} before it finished",))
    emit("probe", {"probe": probe})
    agreed = None
    if profile.agreement_prompts:
        # the agreement keeps what it measured until the deadline (it stops itself there);
        # the clock is the backstop
        agreed = await clock.within(checks.agreement_check(url, inc_url, baseline, profile, clock.end)) \
            or _cut_agreement(profile, clock.cause())
    cap = None
    if profile.slo:
        cap = await clock.within(checks.capacity_check(url, inc_url, baseline, profile, wl)) \
            or _cut_capacity(profile, clock.cause())
    return probe, agreed, cap


def _result(name: str, url: str, inc_url: str | None, baseline: GateResult | None,
            profile: GateProfile, wl: Workload, started: str, facts: dict[str, str], fresh: bool,
            levels: list[LevelResult], probe: ProbeResult, agreed: AgreementResult | None,
            cap: CapacityComparison | None) -> GateResult:
    """The overall verdict and its reasons, as the gate's result."""
    on_traffic = checks.traffic_verdict(levels, profile)
    bars = bar_violations(levels, profile)
    compared = bool(inc_url or baseline is not None)
    verdict = overall(levels, bars, probe, compared=compared, agreed=agreed, traffic=on_traffic,
                      traffic_decides=profile.decide_on == "traffic")
    if cap is not None and not cap.passed:
        verdict = "fail"
    reasons = [r for lv in levels for r in lv.reasons] + bars + list(probe.reasons) + \
        list(agreed.reasons if agreed is not None else ()) + \
        list(cap.reasons if cap is not None else ())
    if profile.decide_on == "traffic" and compared:
        reasons.append(on_traffic.explanation if on_traffic is not None else
                       "traffic: no measured level carries traffic weight; cannot decide on traffic")
    return GateResult(
        name=name, url=url, started_at=started, finished_at=_now(), workload=wl,
        fingerprint=wl.fingerprint(), tolerance=profile.tolerance, host=facts,
        baseline_name=baseline.name if baseline is not None else inc_url,
        baseline_source="live" if inc_url else "stored" if baseline is not None else None,
        baseline_measured_at=baseline.finished_at if baseline is not None else None,
        baseline_age_s=age_s(baseline) if baseline is not None else None,
        session_drift=(0.0 if fresh else profile.session_drift) if baseline is not None else None,
        margin=profile.margin, decide_on=profile.decide_on,
        levels=tuple(levels), probe=probe, agreement=agreed, capacity=cap, traffic=on_traffic,
        bars=tuple(bars), verdict=verdict,
        reasons=tuple(reasons),
    )


async def run_gate_async(
    url: str,
    profile: GateProfile,
    *,
    name: str,
    baseline: GateResult | None = None,
    baseline_url: str | None = None,
    host_facts_extra: dict[str, str] | None = None,
    progress: Progress | None = None,
) -> GateResult:
    """The gate: admit (_admit), measure every level (_levels), the checks (_checks), decide
    (_result)."""
    emit = progress or _noop
    clock = _Clock(profile.gate_deadline_s())
    url = url.rstrip("/")
    wl = profile.workload()
    inc_url, fresh = _admit(url, profile, wl, clock, baseline, baseline_url)
    started = _now()
    facts = {**host_facts(url), **(host_facts_extra or {})}
    emit("start", {"name": name, "url": url, "baseline_url": inc_url, "workload": wl})
    levels = await _levels(url, inc_url, baseline, wl, profile, emit, clock, fresh)
    probe, agreed, cap = await _checks(url, inc_url, baseline, wl, profile, emit, clock)
    return _result(name, url, inc_url, baseline, profile, wl, started, facts, fresh, levels,
                   probe, agreed, cap)


def run_gate(
    url: str,
    profile: GateProfile,
    *,
    name: str,
    baseline: GateResult | None = None,
    baseline_url: str | None = None,
    host_facts: dict[str, str] | None = None,
    progress: Progress | None = None,
) -> GateResult:
    """Synchronous wrapper of run_gate_async (for deploy and the CLI)."""
    return aio.run(lambda: run_gate_async(url, profile, name=name, baseline=baseline,
                                          baseline_url=baseline_url, host_facts_extra=host_facts,
                                          progress=progress))
