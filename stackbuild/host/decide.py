"""What the candidate is measured against, and how a gate result becomes a decision."""

from __future__ import annotations

from stackbuild.gate.result import GateResult
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


def incumbent_result(
    remote: Remote,
    req: DeployRequest,
    svc: Services,
    paths: HostPaths,
    state: HostState,
    incumbent_active: bool,
    rep: DeployReport,
) -> GateResult | None:
    """The incumbent's result on this host for this workload: stored, else measured now."""
    if state.current is None:
        rep.note("baseline", True, "first deploy: absolute bars only")
        return None
    fp = req.profile.workload().fingerprint()
    with rep.step("baseline") as st:
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
                st.detail = f"stored result of {state.current.digest[:19]} (fingerprint {fp})"
                return stored
        if not incumbent_active:
            st.detail = "incumbent not serving and no stored result: absolute bars only"
            return None
        with svc.endpoint(state.current.port) as url:
            measured = svc.gate(url, req.profile, f"incumbent {state.current.stack}", None)
        remote.run(["mkdir", "-p", f"{paths.base}/results"], what="create results dir")
        remote.put_text(measured.model_dump_json(), paths.result_file(state.current.key))
        st.detail = f"measured the incumbent now (fingerprint {fp})"
        return measured
