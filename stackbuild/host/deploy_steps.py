"""The deploy flow's smaller steps (host/deploy.py reads as the list of them): where the candidate runs,
its secrets, the registry channel, readiness, and how long the lock is held."""

from __future__ import annotations

from dataclasses import dataclass, replace

from stackbuild.effects.readiness import Readiness, wait_ready
from stackbuild.errors import StackbuildError
from stackbuild.host import secrets, units
from stackbuild.host.expect_log import unmet
from stackbuild.host.outcome import DeployReport
from stackbuild.host.request import DeployRequest, Services
from stackbuild.host.ssh import Remote
from stackbuild.host.state import HostPaths, HostState, Slot, other
from stackbuild.host.unit_probe import UnitProbe
from stackbuild.spec.stack import Stack

CHANNEL_TRIES = 3
CHANNEL_BACKOFF_S = 2.0


def slot_port(stack: Stack, slot: Slot) -> int:
    """The port the spec gives a unit: the main unit serves runtime.port, the other runtime.staging_port."""
    return stack.runtime.port if slot == "main" else stack.runtime.staging_port


@dataclass(frozen=True)
class Placement:
    """Where the candidate runs while it is tested (unit and port), next to where the incumbent serves."""

    slot: Slot
    port: int
    serving: Slot
    serving_port: int

    @property
    def beside(self) -> bool:
        """In the free unit, beside the incumbent (side-by-side), rather than in its place (swap)."""
        return self.slot != self.serving


def place(stack: Stack, state: HostState, *, in_place: bool) -> Placement:
    """In place (swap): in the incumbent's own unit, on its port. Beside it (side-by-side): in the
    service's other unit, on that unit's port -- runtime.staging_port while the incumbent serves
    runtime.port, and the other way round once a promotion through the gateway left the release on
    the staging unit. A first deploy has nothing to run beside: the main unit, on runtime.port."""
    serving = state.slot
    slot = serving if in_place or state.current is None else other(serving)
    serving_port = state.current.port if state.current else slot_port(stack, serving)
    return Placement(slot, slot_port(stack, slot), serving, serving_port)


def deploy_ports(p: Placement, incumbent_active: bool) -> dict[int, bool]:
    """The ports a deploy binds -> may our own incumbent hold it (preflight): swap binds the incumbent's
    port, which it frees when it stops; side-by-side the other unit's port, which nobody may hold,
    while the incumbent keeps its own until the candidate takes over."""
    if p.beside:
        return {p.port: False, p.serving_port: incumbent_active}
    return {p.port: incumbent_active and p.port == p.serving_port}


def hold_bound_s(req: DeployRequest) -> float:
    """How long this deploy can hold the host lease, each step at its own timeout.

    pull, then start + ready up to three times (candidate, the side-by-side switch, a restore),
    the incumbent's baseline and the candidate's gate (each within the gate's deadline), two drains
    out of the gateway when there is one, and a margin for the SSH steps between them.
    """
    rt, gw = req.stack.runtime, req.stack.gateway
    drains = 2 * gw.drain_timeout_s if gw else 0.0
    return (req.pull_timeout_s + 3 * (rt.start_timeout_s + rt.ready_timeout_s) + 2 * req.profile.gate_deadline_s()
            + drains + 600)


def move_channel(svc: Services, image: str, channel: str, rep: DeployReport) -> str | None:
    """Move the channel tag with retries; None when moved, else the sentence saying what to do."""
    assert svc.promote_channel is not None
    err: Exception | None = None
    with rep.step("channel") as st:
        for attempt in range(CHANNEL_TRIES):
            try:
                st.detail = svc.promote_channel(image)
                return None
            except StackbuildError as e:
                err = e
                if attempt + 1 < CHANNEL_TRIES:
                    svc.sleep(CHANNEL_BACKOFF_S * 2**attempt)
        st.detail = f"not moved after {CHANNEL_TRIES} tries: {str(err).splitlines()[0][:200]}"
    rep.steps[-1].ok = False
    return (
        f"promoted and committed on the host, but the channel {channel!r} is stale (registry: "
        f"{str(err).splitlines()[0][:200]}); move it when the registry is back: "
        f"stackbuild promote {image} --channel {channel}"
    )


def stage_secrets(remote: Remote, req: DeployRequest, paths: HostPaths, rep: DeployReport, *, operator: bool) -> None:
    """Merge the given secret values: into the operator's file (kept for a restore) or the candidate's copy."""
    wanted = req.stack.runtime.secrets
    if not wanted:
        return
    target = secrets.env_file(paths.service) if operator else secrets.candidate_env_file(paths.service)
    with rep.step("secrets") as st:
        missing = secrets.stage(remote, paths, wanted, req.secrets, target=target)
        given = [n for n in wanted if req.secrets.get(n)]
        st.detail = f"{target}: " + (f"set {', '.join(given)}" if given else "unchanged (no values given)")
        if missing:
            st.detail += f"; neither given nor on the host, the server gets none: {', '.join(missing)}"


def readiness(remote: Remote, svc: Services, unit: str, port: int, stack: Stack, rep: DeployReport,
              since: int | None = None) -> Readiness:
    """The candidate's unit serves, and what serves on its port is that unit's own process: one that
    died on the way (say, on a port something else holds) is a start failure whatever answers there;
    then its startup log shows the path its variant claims (server.expect_log)."""
    with rep.step("ready") as st, svc.endpoint(port) as url:
        probe = UnitProbe(remote, unit, port, svc.http_probe(url))
        ready = wait_ready(
            probe,
            start_deadline_s=stack.runtime.start_timeout_s,
            ready_deadline_s=stack.runtime.ready_timeout_s,
            pace=svc.pace,
        )
        if ready.ok:
            why = probe.confirm()
            ready = (Readiness(False, why[0], why[1], ready.seconds, ready.layers) if why is not None
                     else replace(ready, identity=probe.invocation))
        if ready.ok and since is not None:
            ready = expected_path(remote, unit, stack, since, ready)
        st.detail = f"{ready.stage}: {ready.detail}"
    if not ready.ok:
        rep.steps[-1].ok = False
    return ready


def not_the_candidate(remote: Remote, svc: Services, unit: str, port: int, ready: Readiness) -> str | None:
    """Before and after the gate: None while the process readiness confirmed (`ready.identity`) still
    answers on its port, else why not (a result measured on anything else is not the candidate's)."""
    with svc.endpoint(port) as url:
        probe = UnitProbe(remote, unit, port, svc.http_probe(url))
        why = probe.confirm()
    if why is not None:
        return why[1]
    if probe.invocation != ready.identity:
        return (f"{unit} was started again (its process is not the one that passed readiness: "
                f"{ready.identity} then, {probe.invocation} now)")
    return None


def expected_path(remote: Remote, unit: str, stack: Stack, since: int, ready: Readiness) -> Readiness:
    """A server that serves still fails its start when its log does not show the path its variant
    claims (server.expect_log, read from the unit's journal since `since`): stage "expect-log"."""
    expect = stack.server.expect_log
    if not expect:
        return ready
    why = unmet(expect, units.logs_since(remote, unit, unit.removesuffix(".service"), since))
    if why is None:
        return replace(ready, detail=f"{ready.detail}; startup log shows the expected path")
    return replace(ready, ok=False, stage="expect-log", detail=why)

