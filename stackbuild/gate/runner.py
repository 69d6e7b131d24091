"""run_gate: measure a candidate (and a live incumbent), decide per level, apply bars and probe.

With a live incumbent the two are measured in alternation (incumbent run, then
candidate run) so slow drifts of the machine hit both alike.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any

from stackbuild.effects import aio, http
from stackbuild.effects.readiness import HttpProbe, wait_ready
from stackbuild.errors import InfraError, InputError
from stackbuild.gate import checks, loadgen
from stackbuild.gate.probe import run_probe
from stackbuild.gate.result import (
    AgreementResult,
    GateResult,
    LevelResult,
    ProbeResult,
    RunMetrics,
    Verdict,
    Workload,
)
from stackbuild.gate.stats import allowed, compare
from stackbuild.spec.profile import GateProfile

Progress = Callable[[str, dict[str, Any]], None]


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _noop(kind: str, data: dict[str, Any]) -> None:
    return None


# _reachable and host_facts block the event loop on purpose: they run before any load task
# exists, so there is nothing to starve, and no worker thread is left behind when a
# SIGTERM interrupts the gate there.
def _reachable(url: str, what: str, deadline_s: float) -> None:
    """Port open, /health 200 and one generation, else InfraError (exit 4) naming the layer."""
    if not http.port_open(url, 3.0):
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


def level_summary(concurrency: int, runs: list[RunMetrics]) -> LevelResult:
    return LevelResult(
        concurrency=concurrency,
        runs=tuple(runs),
        median_output_tok_s=statistics.median(r.output_tok_s for r in runs),
        median_total_tok_s=statistics.median(r.total_tok_s for r in runs),
        ttft_p99_ms=max(r.ttft_ms.p99 for r in runs),
        failed_requests=sum(r.failed for r in runs),
    )


def judge_level(
    level: LevelResult, incumbent: list[float] | None, profile: GateProfile, *, final: bool
) -> LevelResult:
    """Attach the comparison and verdict; 'inconclusive' only when final (no runs left)."""
    reasons: list[str] = []
    verdict: Verdict = "reference"
    fields: dict[str, Any] = {}
    if level.failed_requests > profile.max_failed_requests:
        errs = sorted({e for r in level.runs for e in r.errors})[:3]
        reasons.append(f"C={level.concurrency}: {level.failed_requests} failed requests "
                       f"(allowed {profile.max_failed_requests}): {'; '.join(errs)}")
        verdict = "fail"
    mismatched = sum(r.token_count_mismatches for r in level.runs)
    if mismatched:
        reasons.append(f"C={level.concurrency}: in {mismatched} requests the server's token "
                       "counts disagree with what it streamed; the tok/s cannot be trusted")
        verdict = "fail"
    broken = verdict == "fail"
    if incumbent:
        inc_med = statistics.median(incumbent)
        fields["baseline_median_output_tok_s"] = inc_med
        fields["baseline_runs_tok_s"] = tuple(incumbent)
        if inc_med <= 0:
            reasons.append(f"C={level.concurrency}: the incumbent measured 0 tok/s; re-measure it")
            verdict = "fail" if verdict == "fail" else "inconclusive"
        else:
            bar = profile.bar(level.concurrency)
            cmp = compare([r.output_tok_s for r in level.runs], incumbent,
                          tolerance=1.0 - bar, confidence=profile.confidence,
                          seed=profile.seed + level.concurrency)
            fields.update(ratio=cmp.ratio, ci_low=cmp.low, ci_high=cmp.high)
            ci = f"ratio {cmp.ratio:.3f}, {profile.confidence:.0%} CI [{cmp.low:.3f}, {cmp.high:.3f}]"
            if cmp.decision == "fail":
                reasons.append(f"C={level.concurrency}: slower than the incumbent allows: {ci} < {bar:.3f} "
                               f"({allowed(bar)})")
                verdict = "fail"
            elif cmp.decision == "undecided" and verdict != "fail":
                verdict = "inconclusive"
                if final:
                    reasons.append(f"C={level.concurrency}: cannot tell after {len(level.runs)} "
                                   f"runs: {ci} straddles {bar:.3f}; raise max_runs or tolerance")
            elif verdict != "fail":
                verdict = "pass"
            fields["explanation"] = explain(level.concurrency, cmp.ratio, cmp.low, cmp.high,
                                            bar, verdict, profile.policy(level.concurrency).required)
    pol = profile.policy(level.concurrency)
    # failed requests and miscounted tokens decide at every level; the ratio only where required
    required = pol.required or broken
    fields.update(bar=profile.bar(level.concurrency) if incumbent else None, required=required)
    if not required:
        reasons = [f"{r} (advisory level)" for r in reasons]
    return level.model_copy(update={**fields, "verdict": verdict, "reasons": tuple(reasons)})


def _pct(x: float) -> str:
    return f"{(x - 1) * 100:+.1f}%"


def explain(c: int, ratio: float, low: float, high: float, bar: float, verdict: Verdict,
            required: bool) -> str:
    """One sentence per level: "C=1 -6.4% (CI -8.1%..-4.6%), allowed -8%: pass"."""
    word = {"inconclusive": "cannot tell yet"}.get(verdict, verdict)
    tail = "" if required else " (advisory: does not decide the gate)"
    return f"C={c} {_pct(ratio)} (CI {_pct(low)}..{_pct(high)}), {allowed(bar)}: {word}{tail}"


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


def overall(levels: list[LevelResult], bars: list[str], probe: ProbeResult | None,
            compared: bool, agreed: AgreementResult | None = None) -> Verdict:
    deciding = [lv for lv in levels if lv.required]
    if agreed is not None and not agreed.passed:
        return "fail"
    if bars or (probe is not None and not probe.passed) or any(
            lv.verdict == "fail" for lv in deciding):
        return "fail"
    if any(lv.verdict == "inconclusive" for lv in deciding):
        return "inconclusive"
    return "pass" if compared else "reference"


def _check_baseline(baseline: GateResult, wl: Workload) -> None:
    if baseline.fingerprint != wl.fingerprint():
        raise InputError(
            f"--baseline: {baseline.name!r} measured workload {baseline.fingerprint}, this gate "
            f"measures {wl.fingerprint()} (lengths, api, seed or model differ); "
            "re-measure the incumbent with the same profile"
        )


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
    profile: GateProfile, emit: Progress, cand: list[RunMetrics] | None = None,
) -> LevelResult:
    """Runs at one level until the comparison decides or max_runs is reached.

    `cand` collects the candidate's runs as they finish (the deadline keeps what was measured).
    """
    cand = [] if cand is None else cand
    inc_runs: list[RunMetrics] = []
    target = wl.runs
    # failed requests past what the profile allows fail the level (judge_level): the first one
    # decides it, so the candidate's run stops there and no more runs are measured
    allowed = profile.max_failed_requests
    while True:
        while len(cand) < target and sum(r.failed for r in cand) <= allowed:
            if inc_url:
                inc_runs.append(await _measure(inc_url, wl, c, len(inc_runs), "incumbent", emit))
            cand.append(await _measure(url, wl, c, len(cand), "candidate", emit,
                                       fail_after=allowed - sum(r.failed for r in cand)))
        incumbent = ([r.output_tok_s for r in inc_runs] if inc_url else
                     [r.output_tok_s for r in stored.runs] if stored else None)
        final = target >= wl.max_runs
        lv = judge_level(level_summary(c, cand), incumbent, profile, final=final)
        if lv.verdict != "inconclusive" or final:
            return lv
        target += 1


async def _level_by_deadline(c: int, deadline: float, profile: GateProfile, done: list[RunMetrics],
                             level: Coroutine[Any, Any, LevelResult]) -> LevelResult:
    """The level's result, or a failed level when the whole gate's deadline passes first."""
    try:
        return await asyncio.wait_for(level, timeout=max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        cause = (f"C={c}: the gate's deadline of {profile.gate_deadline_s():g}s passed before this "
                 f"level finished (stall timeout {profile.stall_timeout_s:g}s per request)")
        if done:
            lv = level_summary(c, done)
            return lv.model_copy(update={"verdict": "fail", "reasons": (cause,)})
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
    emit = progress or _noop
    url = url.rstrip("/")
    wl = profile.workload()
    if baseline is not None and baseline_url is not None:
        raise InputError("give either --baseline FILE or --baseline-url URL, not both")
    if baseline is not None:
        _check_baseline(baseline, wl)
    _reachable(url, "candidate", profile.ready_timeout_s)
    inc_url = baseline_url.rstrip("/") if baseline_url else None
    if inc_url:
        _reachable(inc_url, "incumbent", profile.ready_timeout_s)
    started = _now()
    facts = {**host_facts(url), **(host_facts_extra or {})}
    emit("start", {"name": name, "url": url, "baseline_url": inc_url, "workload": wl})
    for target in [u for u in (inc_url, url) if u]:
        await loadgen.warmup(target, wl, max(wl.concurrency))
    levels: list[LevelResult] = []
    deadline = time.monotonic() + profile.gate_deadline_s()
    for c in wl.concurrency:
        emit("level", {"concurrency": c})
        stored = baseline.level(c) if baseline is not None else None
        done: list[RunMetrics] = []
        lv = await _level_by_deadline(c, deadline, profile, done,
                                      _run_level(c, url, inc_url, stored, wl, profile, emit, done))
        if baseline is not None and stored is None:
            note = f"C={c}: the baseline file has no runs at this level"
            lv = lv.model_copy(update={"reasons": (*lv.reasons, note)})
        emit("decision", {"concurrency": c, "level": lv})
        levels.append(lv)
    try:
        probe = await asyncio.wait_for(_probe(url, inc_url, baseline, profile),
                                       timeout=max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        probe = ProbeResult(passed=False, reasons=(
            f"probe: not finished by the gate's deadline of {profile.gate_deadline_s():g}s",))
    emit("probe", {"probe": probe})
    agreed = await checks.agreement_check(url, inc_url, baseline, profile, deadline)
    cap = await checks.capacity_check(url, inc_url, baseline, profile, wl)
    on_traffic = checks.traffic_verdict(levels, profile)
    bars = bar_violations(levels, profile)
    verdict = overall(levels, bars, probe, compared=bool(inc_url or baseline is not None),
                      agreed=agreed)
    if cap is not None and not cap.passed:
        verdict = "fail"
    reasons = [r for lv in levels for r in lv.reasons] + bars + list(probe.reasons) + \
        list(agreed.reasons if agreed is not None else ()) + \
        list(cap.reasons if cap is not None else ())
    return GateResult(
        name=name, url=url, started_at=started, finished_at=_now(), workload=wl,
        fingerprint=wl.fingerprint(), tolerance=profile.tolerance, host=facts,
        baseline_name=baseline.name if baseline is not None else inc_url,
        levels=tuple(levels), probe=probe, agreement=agreed, capacity=cap, traffic=on_traffic,
        bars=tuple(bars), verdict=verdict,
        reasons=tuple(reasons),
    )


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
