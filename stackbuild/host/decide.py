"""What the candidate is measured against, and how a gate result becomes a decision."""

from __future__ import annotations

import time

from stackbuild.gate.decide import swap_gap
from stackbuild.gate.result import GateResult, age_s
from stackbuild.host.outcome import DeployReport
from stackbuild.host.request import DeployRequest, Services
from stackbuild.host.ssh import Remote
from stackbuild.host.state import HostPaths, HostState


def verdict_of(result: GateResult, *, first: bool) -> str:
    # With no incumbent the gate has only absolute bars and the probe: a clean
    # "reference" result is a pass.
    if result.verdict == "reference":
        clean = not result.bars and (result.probe is None or result.probe.passed)
        return "pass" if first and clean else "fail"
    return result.verdict


# the host facts a stored baseline must share with the host now to stand for the incumbent
HOST_FINGERPRINT = ("gpu_model", "gpu_count", "driver")


def why_remeasure(stored: GateResult, host_facts: dict[str, str], max_age_s: float,
                  min_runs: int = 1, max_gap_runs: int | None = None, now: float | None = None) -> str | None:
    """Why a stored baseline no longer stands for the incumbent, or None: older than the
    profile's bound, measured on other GPUs or another driver than the host has now,
    thinner than `min_runs` runs at a level (a promotion the gate decided early), or ended
    more than `max_gap_runs` of its own runs' time before `now` (a swap pairs its runs across
    that gap: the detrended comparison extrapolates a drift over it, and past the runs the
    candidate may take it can no longer decide; a CI run's equal build read -31%..+14% across
    38 runs' gap)."""
    changed = [f"{k} {stored.host[k]} -> {host_facts[k]}" for k in HOST_FINGERPRINT
               if stored.host.get(k) and host_facts.get(k) and stored.host[k] != host_facts[k]]
    if changed:
        return f"the host changed since it was measured ({', '.join(changed)})"
    age = age_s(stored)
    if age is None or age > max_age_s:
        return (f"it is {'of unknown age' if age is None else f'{age / 3600:.1f} h old'}, "
                f"past the profile's bound of {max_age_s / 3600:g} h (a swap compares with the "
                "incumbent measured in this session)")
    thin = [f"C={lv.concurrency}" for lv in stored.levels if len(lv.runs) < min_runs]
    if thin:
        return (f"it has fewer than the {min_runs} runs a baseline needs at {', '.join(thin)} "
                "(its gate decided early)")
    if max_gap_runs is None:
        return None
    gap = max((swap_gap(lv.runs, time.time() if now is None else now) for lv in stored.levels), default=0)
    if gap > max_gap_runs:
        return (f"it ended {gap} runs' time ago, more than the {max_gap_runs} runs the candidate may take (a "
                "swap compares with the incumbent measured right before it)")
    return None


def live_port(req: DeployRequest, state: HostState, *, beside: bool, incumbent_active: bool) -> int | None:
    """The serving incumbent's port when the gate measures it live (the profile's `incumbent: live`,
    the candidate beside it, the incumbent serving), else None: the comparison is with a result."""
    live = req.profile.incumbent == "live" and beside and incumbent_active
    return state.current.port if live and state.current is not None else None


def incumbent_result(
    remote: Remote,
    req: DeployRequest,
    svc: Services,
    paths: HostPaths,
    state: HostState,
    incumbent_active: bool,
    rep: DeployReport,
) -> GateResult | None:
    """The incumbent's result on this host for this workload: stored, else measured now.

    The candidate is compared with the incumbent measured in this session, on the same seeded
    prompts (run i with run i): a stored result older than `fresh_baseline_s` (or past
    `baseline_max_age_s`), from other GPUs or another driver is measured again while the
    incumbent still serves (before the swap stops it). The stored result then only says how
    far the incumbent drifted since (in the step's detail)."""
    if state.current is None:
        rep.note("baseline", True, "first deploy: absolute bars only")
        return None
    fp = req.profile.workload().fingerprint()
    with rep.step("baseline") as st:
        stored: GateResult | None = None
        res = remote.run(
            ["cat", paths.result_file(state.current.key)],
            check=False,
            what="read the incumbent's result",
            changes=False,
        )
        if res.ok:
            try:
                stored = GateResult.model_validate_json(res.stdout)
            except ValueError:
                stored = None
            same_path = stored is not None and stored.host.get("access", "direct") == svc.access
            if stored is not None and stored.fingerprint == fp and same_path:
                why = why_remeasure(stored, rep.host_facts,
                                    min(req.profile.baseline_max_age_s,
                                        req.profile.fresh_baseline_s),
                                    req.profile.baseline_runs(), req.profile.max_runs)
                said = f"stored result of {state.current.digest[:19]} (fingerprint {fp})"
                if why is None or not incumbent_active:
                    st.detail = said + (f"; {why}, but the incumbent is not serving" if why else "")
                    return stored
                st.detail = f"{said} not used: {why}; "
        if not incumbent_active:
            st.detail = "incumbent not serving and no stored result: absolute bars only"
            return None
        with svc.endpoint(state.current.port) as url:
            measured = svc.gate(url, req.profile, f"incumbent {state.current.stack}", None)
        if rep.host_facts:
            measured = measured.model_copy(update={"host": {**measured.host, **rep.host_facts}})
        remote.run(["mkdir", "-p", f"{paths.base}/results"], what="create results dir")
        remote.put_text(measured.model_dump_json(), paths.result_file(state.current.key))
        st.detail = (st.detail or "") + f"measured the incumbent now (fingerprint {fp})" + \
            drift_seen(stored, measured)
        return measured


def drift_seen(stored: GateResult | None, now: GateResult) -> str:
    """"; it measures +0.4% at C=1 against its stored result": what the stored result still
    says once the incumbent is measured again (the drift between the two sessions)."""
    if stored is None or stored.fingerprint != now.fingerprint:
        return ""
    said = []
    for lv in now.levels:
        old = stored.level(lv.concurrency)
        if old is not None and old.median_output_tok_s > 0 and lv.median_output_tok_s > 0:
            change = lv.median_output_tok_s / old.median_output_tok_s - 1.0
            said.append(f"{change * 100:+.1f}% at C={lv.concurrency}")
    return f"; it measures {', '.join(said)} against its stored result" if said else ""
