"""The deploy flow: lease, recover, preflight, pull, stage, start, readiness, gate, decide.

Where strategies differ (what makes room for the candidate, how it comes to serve once it passed)
the flow asks the strategy's module (strategy.py, strategies/).

It receives a `Remote` and never opens one. Every step is safe to repeat: the
host state file carries a `pending` marker from the moment the incumbent may
be disturbed until the outcome is committed, and whoever takes the lease next
first converges the host back to `current` (see converge.py).

Exit codes: 0 promoted; 1 the candidate was rejected (crashed, never ready,
failed its first generation, or the gate failed) and the incumbent restored;
3 gate inconclusive, incumbent restored; 4 infrastructure (SSH, registry,
preflight, lease held), with nothing changed unless the report says so.
"""

from __future__ import annotations

from contextlib import ExitStack

from stackbuild.effects.readiness import Readiness
from stackbuild.errors import EXIT_INFRA, StackbuildError
from stackbuild.gate.result import GateResult
from stackbuild.host import converge, secrets, units
from stackbuild.host.crash import classify
from stackbuild.host.decide import incumbent_result, live_port, verdict_of
from stackbuild.host.deploy_steps import (
    CHANNEL_TRIES,
    deploy_ports,
    hold_bound_s,
    move_channel,
    not_the_candidate,
    place,
    readiness,
    stage_secrets,
)
from stackbuild.host.outcome import DeployReport
from stackbuild.host.pool import GatewayLink
from stackbuild.host.preflight import PreflightFailed, run_preflight
from stackbuild.host.request import DeployRequest, LiveIncumbent, Services
from stackbuild.host.ssh import ConnectionLost, Remote
from stackbuild.host.state import (
    HostLease,
    HostPaths,
    HostState,
    LeaseHeld,
    Pending,
    Release,
    me,
    now_iso,
    read_state,
    write_state,
)
from stackbuild.host.strategy import Candidate, Served, Strategy, strategy_named
from stackbuild.image.smoke import host_kernel_check_argv

__all__ = ["CHANNEL_TRIES", "deploy", "hold_bound_s", "recover"]


def deploy(remote: Remote, req: DeployRequest, svc: Services) -> DeployReport:
    stack = req.stack
    paths = HostPaths(stack.host.state_dir, stack.host.service)
    rep = DeployReport(
        host=remote.address,
        service=stack.host.service,
        stack=stack.label,
        image=req.image,
        strategy=req.strategy,
        live=svc.progress,
    )
    lock = HostLease(remote, paths, me(f"deploy {stack.label}", hold_bound_s(req), req.run), req.lease_ttl_s)
    try:
        with rep.step("lock") as st:
            lock.__enter__()
            st.detail = f"broke a stale lock ({lock.broke.what})" if lock.broke else "held"
    except LeaseHeld as err:
        rep.finish("refused", str(err), EXIT_INFRA)
        return rep
    except ConnectionLost as err:
        rep.finish("failed", str(err), EXIT_INFRA)
        return rep
    released = False
    try:
        _locked(remote, req, svc, paths, rep)
    except ConnectionLost as err:
        rep.needs_recovery = True
        rep.finish("failed", str(err), EXIT_INFRA)
        released = True  # cannot release over a dead connection; the recovery run will
    finally:
        if not released:
            try:
                lock.__exit__(None, None, None)
            except ConnectionLost as err:
                rep.needs_recovery = True
                rep.finish("failed", str(err), EXIT_INFRA)
    return rep


def _locked(remote: Remote, req: DeployRequest, svc: Services, paths: HostPaths, rep: DeployReport) -> None:
    stack = req.stack
    with rep.step("state"):
        state = read_state(remote, paths)
    if state.pending is not None:
        with rep.step("recover") as st:
            st.detail = f"an interrupted {state.pending.op} of {state.pending.image} was pending"
            # what an interrupted run may have left in the pool (a candidate that was taking over) is
            # drained before it stops; the gateway step below brings the serving release in
            state = converge.to_current(remote, paths, state, _conv(req, svc, rep, join=False))
    incumbent_active = state.current is not None and units.is_active(remote, paths.unit_of(state.slot))
    requested = strategy_named(req.strategy)
    p = place(stack, state, in_place=requested.IN_PLACE)
    strategy = strategy_named(requested.runs_as(p, svc.gateway))
    unit = paths.unit_of(p.slot)
    try:
        with rep.step("preflight") as st:
            pf = run_preflight(remote, stack, image=req.image, ports=deploy_ports(p, incumbent_active))
            st.detail = "; ".join(f"{c.name}: {c.detail}" for c in pf.checks)
            if not pf.ok:
                raise PreflightFailed(remote.address, pf)
            rep.host_facts = pf.host_facts()  # results group by the hardware they were measured on
        with rep.step("pull") as st:
            pulled = units.ensure_image(remote, req.image, req.pull_timeout_s)
            st.detail = "pulled" if pulled else "already on the host"
        if svc.gateway is not None:
            with rep.step("gateway") as st:
                st.detail = svc.gateway.bring_up(p.serving_port if incumbent_active else None,
                                                 dry_run=remote.dry_run)
        with rep.step("stage unit") as st:
            env = {"env_file": secrets.candidate_env_file(paths.service)} if p.beside else {}
            text = svc.render_unit(stack, image=req.image, port=p.port, name=unit.removesuffix(".service"), **env)
            staged = units.stage_and_verify(remote, paths.staging_dir, unit, text)
            st.detail = f"{unit} verified"
        if (kernels := host_kernel_check_argv(stack, req.image)) is not None and not remote.dry_run:
            with rep.step("kernel check") as st:
                st.detail = units.kernel_check(remote, kernels)
        if not p.beside and incumbent_active and svc.outage_plan is not None and not remote.dry_run:
            with rep.step("outage plan") as st:  # said before the incumbent stops, not after
                st.detail = svc.outage_plan()
    except ConnectionLost:
        raise
    except StackbuildError as err:
        rep.finish("refused", str(err), getattr(err, "exit_code", EXIT_INFRA))
        return
    c = Candidate(remote, req, svc, paths, rep, state, _conv(req, svc, rep), p, staged, text, incumbent_active)
    if remote.dry_run:
        stage_secrets(remote, req, paths, rep, operator=not p.beside)
        _dry_plan(c, strategy)
        return

    live = live_port(req, state, beside=p.beside, incumbent_active=incumbent_active)
    if live is not None:
        rep.note("baseline", True, f"live: the incumbent on port {live}, measured in alternation with the "
                                   "candidate (ABBA, the profile's incumbent: live)")
    baseline = None if live is not None else incumbent_result(remote, req, svc, paths, state, incumbent_active, rep)
    pending = Pending(
        op="deploy",
        image=req.image,
        strategy=req.strategy,
        owner=me("deploy").to_json(),
        started_at=now_iso(),
    )
    with rep.step("mark pending"):
        write_state(remote, paths, state.model_copy(update={"pending": pending}))

    try:
        stage_secrets(remote, req, paths, rep, operator=not p.beside)
        _run_candidate(c, strategy, baseline, live)
    except ConnectionLost:
        raise
    except Exception as err:
        # Anything unexpected once the host is disturbed: put the incumbent back
        # first; a bug (not a StackbuildError) still surfaces after that.
        cause = f"deploy step failed: {(str(err) or type(err).__name__).splitlines()[0]}"
        c.roll_back(cause, verdict="error")
        rep.finish("rolled-back", cause, getattr(err, "exit_code", EXIT_INFRA))
        if not isinstance(err, StackbuildError):
            raise


def _run_candidate(c: Candidate, strategy: Strategy, baseline: GateResult | None, live: int | None) -> None:
    """Start the candidate where the strategy placed it, gate it, let the strategy make it serve, promote."""
    ready = _start(c, strategy)
    if ready is None:
        return
    result = _gate(c, ready, baseline, live)
    if result is None:
        return
    served = strategy.hand_over(c)
    if served is None:
        return
    _promote(c, served, result)


def _start(c: Candidate, strategy: Strategy) -> Readiness | None:
    """The candidate's unit installed and started, then ready: its readiness, or None once rolled back."""
    remote, paths, p, unit, rep = c.remote, c.paths, c.p, c.unit, c.rep
    with rep.step("start") as st:
        since = units.remote_now(remote)
        st.detail = strategy.start(c)
        units.install(remote, c.staged, paths.runs_from(p.slot, serving=not p.beside))  # /run: a reboot brings
        units.start(remote, unit)  # back the incumbent
        st.detail += f"{unit} on port {p.port}"
    ready = readiness(remote, c.svc, unit, p.port, c.req.stack, rep, since)
    if not ready.ok:
        logs = units.logs_since(remote, unit, unit.removesuffix(".service"), since)
        sig = classify(f"{logs}\n{ready.detail}")
        rep.logs = logs[-8000:]
        if sig:
            rep.crash_signature, rep.crash_line = sig.kind, sig.line
        what = {
            "crashed": "candidate crashed on start",
            "generate": "candidate was ready but failed its first generation",
            "identity": "candidate is not what answers on its port",
            "expect-log": "candidate serves, but not on the path its variant claims",
        }.get(ready.stage, "candidate never became ready")
        cause = f"{what}: {ready.detail}" + (f" [{sig.kind}: {sig.hint}]" if sig else "")
        c.roll_back(cause, verdict="not-ready")
        return None
    c.conv.outage_end()  # the candidate serves where the incumbent stopped (an outage only a swap began)
    return ready


def _gate(c: Candidate, ready: Readiness, baseline: GateResult | None, live: int | None) -> GateResult | None:
    """The gate on the very process readiness confirmed (against the incumbent serving on port `live`, else
    `baseline`): its result when it passed, else None (rolled back)."""
    remote, svc, unit, port, rep = c.remote, c.svc, c.unit, c.p.port, c.rep
    if (other := not_the_candidate(remote, svc, unit, port, ready)) is not None:
        c.roll_back(f"candidate lost before its gate: {other}", verdict="not-ready")
        return None
    with rep.step("gate") as st, svc.endpoint(port) as url, ExitStack() as inc:
        against: GateResult | LiveIncumbent | None = baseline
        if live is not None and c.state.current is not None:
            against = LiveIncumbent(inc.enter_context(svc.endpoint(live)), f"incumbent {c.state.current.stack}")
        result = svc.gate(url, c.req.profile, c.req.stack.label, against)
        if rep.host_facts:
            result = result.model_copy(update={"host": {**result.host, **rep.host_facts}})
        rep.verdict = verdict_of(result, first=against is None)
        rep.gate_json = result.model_dump_json()
        st.detail = f"{rep.verdict}" + (f": {'; '.join(result.reasons)[:300]}" if result.reasons else "")
        if (other := not_the_candidate(remote, svc, unit, port, ready)) is not None:
            st.detail = f"not the candidate's result: {other}"
            rep.verdict = "error"
            rep.steps[-1].ok = False
    if other is not None:  # no verdict on the candidate: an infrastructure failure, not a rejection
        cause = f"the gate did not measure the candidate: {other}"
        c.roll_back(cause, verdict="error")
        rep.finish("rolled-back", cause, EXIT_INFRA)
        return None
    if rep.verdict != "pass":
        reasons = "; ".join([*result.reasons, *result.bars])[:500] or "no reason given"
        c.roll_back(f"gate {rep.verdict}: {reasons}", verdict=rep.verdict)
        return None
    return result


def _promote(c: Candidate, served: Served, result: GateResult) -> None:
    """Commit the release on the host, then put it back into the gateway and move the channel."""
    remote, paths, req, rep, stack, gw = c.remote, c.paths, c.req, c.rep, c.req.stack, c.svc.gateway
    with rep.step("promote") as st:
        release = Release(image=req.image, digest=req.digest, stack=stack.name, variant=stack.variant,
                          unit=served.text, port=served.port, verdict=rep.verdict, at=now_iso(), slot=served.slot)
        new_state = HostState(
            service=paths.service,
            current=release,
            previous=c.state.current,
            last_verdict=rep.verdict,
            last_cause=None,
            last_image=req.image,
            last_at=now_iso(),
        )
        remote.run(["mkdir", "-p", f"{paths.base}/results"], what="create results dir")
        remote.put_text(result.model_dump_json(), paths.result_file(release.key))
        converge.commit(remote, paths, new_state, served.staged, served.ran_from)
        st.detail = f"host state committed; {paths.unit_of(served.slot)} enabled (starts on boot)"
    # Committed on the host: from here nothing undoes the promotion. A gateway that will not take
    # the host back, or a channel that will not move, is reported (exit 4), never rolled back.
    if gw is not None and served.rejoin and (stale := _rejoin(gw, served.port, rep)):
        rep.finish("promoted", stale, EXIT_INFRA)
        return
    if c.svc.promote_channel and stack.host.channel:
        stale = move_channel(c.svc, req.image, stack.host.channel, rep)
        if stale:
            rep.finish("promoted", stale, EXIT_INFRA)
            return
    rep.finish("promoted")


def _rejoin(gw: GatewayLink, port: int, rep: DeployReport) -> str | None:
    """The promoted server back into the gateway; None when in, else what to do."""
    try:
        with rep.step("gateway") as st:
            st.detail = gw.join(port)
        return None
    except StackbuildError as err:
        return (f"promoted and committed on the host, but not back in the gateway {gw.url} "
                f"({str(err).splitlines()[0][:200]}); re-run the deploy to put it back")


def _dry_plan(c: Candidate, strategy: Strategy) -> None:
    """Say what the deploy would do; the host commands it would send are the dry remote's to print."""
    echo, paths, p, unit = c.svc.echo, c.paths, c.p, c.unit
    echo(f"would mark the deploy pending in {paths.state_file}")
    strategy.plan_start(c)
    units.install(c.remote, c.staged, paths.runs_from(p.slot, serving=not p.beside))
    units.start(c.remote, unit)
    echo(f"would wait for {unit}: port {p.port}, /health 200, one generation")
    echo(f"would gate it with profile {c.req.profile.description or 'default'}")
    if c.svc.gate_plan is not None:
        live = live_port(c.req, c.state, beside=p.beside, incumbent_active=c.incumbent_active)
        echo(c.svc.gate_plan(c.req.profile, live is None))
    strategy.plan_hand_over(c)
    echo(f"would promote (write {paths.state_file}) or roll back to the incumbent")
    c.rep.finish("planned")


def _conv(req: DeployRequest, svc: Services, rep: DeployReport, *, join: bool = True) -> converge.Converger:
    conv = converge.converger_for(req.stack, svc.endpoint, rep, req.pull_timeout_s, http_probe=svc.http_probe,
                                  pace=svc.pace)
    conv.link, conv.join = svc.gateway, join
    return conv


def recover(remote: Remote, req: DeployRequest, svc: Services, rep: DeployReport) -> None:
    """After a lost connection: put the host back to its committed state and free the lock."""
    paths = HostPaths(req.stack.host.state_dir, req.stack.host.service)
    with HostLease(remote, paths, me(f"recover {req.stack.label}", run=req.run), req.lease_ttl_s):
        state = read_state(remote, paths)
        if state.pending is None:
            rep.note("recover", True, "nothing pending")
            return
        converge.to_current(remote, paths, state, _conv(req, svc, rep))
        rep.needs_recovery = False
