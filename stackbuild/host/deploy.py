"""The deploy flow: lock, recover, preflight, pull, stage, start, readiness, gate, decide.

It receives a `Remote` and never opens one. Every step is safe to repeat: the
host state file carries a `pending` marker from the moment the incumbent may
be disturbed until the outcome is committed, and whoever takes the lock next
first converges the host back to `current` (see converge.py).

Exit codes: 0 promoted; 1 the candidate was rejected (crashed, never ready,
failed its first generation, or the gate failed) and the incumbent restored;
3 gate inconclusive, incumbent restored; 4 infrastructure (SSH, registry,
preflight, lock held), with nothing changed unless the report says so.
"""

from __future__ import annotations

from stackbuild.effects.readiness import Readiness, wait_ready
from stackbuild.errors import EXIT_INFRA, StackbuildError
from stackbuild.gate.result import GateResult
from stackbuild.host import converge, secrets, units
from stackbuild.host.crash import classify
from stackbuild.host.decide import incumbent_result, verdict_of
from stackbuild.host.outcome import DeployReport
from stackbuild.host.preflight import PreflightFailed, run_preflight
from stackbuild.host.request import DeployRequest, Services
from stackbuild.host.ssh import ConnectionLost, Remote
from stackbuild.host.state import (
    HostLock,
    HostPaths,
    HostState,
    LockHeld,
    Pending,
    Release,
    me,
    now_iso,
    read_state,
    write_state,
)
from stackbuild.host.unit_probe import UnitProbe
from stackbuild.image.smoke import host_kernel_check_argv
from stackbuild.spec.stack import Stack

CHANNEL_TRIES = 3
CHANNEL_BACKOFF_S = 2.0

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
    lock = HostLock(remote, paths, me(f"deploy {stack.label}", hold_bound_s(req)), req.lock_ttl_s)
    try:
        with rep.step("lock") as st:
            lock.__enter__()
            st.detail = f"broke a stale lock ({lock.broke.what})" if lock.broke else "held"
    except LockHeld as err:
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


def hold_bound_s(req: DeployRequest) -> float:
    """How long this deploy can hold the host lock, each step at its own timeout.

    pull, then start + ready up to three times (candidate, the side-by-side switch, a restore),
    the incumbent's baseline and the candidate's gate (each within the gate's deadline), and a
    margin for the SSH steps between them.
    """
    rt = req.stack.runtime
    return req.pull_timeout_s + 3 * (rt.start_timeout_s + rt.ready_timeout_s) + 2 * req.profile.gate_deadline_s() + 600


def _locked(remote: Remote, req: DeployRequest, svc: Services, paths: HostPaths, rep: DeployReport) -> None:
    stack = req.stack
    sbs = req.strategy == "side-by-side"
    with rep.step("state"):
        state = read_state(remote, paths)
    if state.pending is not None:
        with rep.step("recover") as st:
            st.detail = f"an interrupted {state.pending.op} of {state.pending.image} was pending"
            state = converge.to_current(remote, paths, state, _conv(req, svc, rep))
    incumbent_active = state.current is not None and units.is_active(remote, paths.main_unit)
    port = stack.runtime.staging_port if sbs else stack.runtime.port
    try:
        with rep.step("preflight") as st:
            pf = run_preflight(remote, stack, image=req.image, strategy=req.strategy, incumbent_active=incumbent_active)
            st.detail = "; ".join(f"{c.name}: {c.detail}" for c in pf.checks)
            if not pf.ok:
                raise PreflightFailed(remote.address, pf)
            rep.host_facts = pf.host_facts()  # results group by the hardware they were measured on
        with rep.step("pull") as st:
            pulled = units.ensure_image(remote, req.image, req.pull_timeout_s)
            st.detail = "pulled" if pulled else "already on the host"
        unit = paths.candidate_unit if sbs else paths.main_unit
        name = unit.removesuffix(".service")
        with rep.step("stage unit") as st:
            env = {"env_file": secrets.candidate_env_file(paths.service)} if sbs else {}
            text = svc.render_unit(stack, image=req.image, port=port, name=name, **env)
            staged = units.stage_and_verify(remote, paths.staging_dir, unit, text)
            st.detail = f"{unit} verified"
        if (kernels := host_kernel_check_argv(stack, req.image)) is not None and not remote.dry_run:
            with rep.step("kernel check") as st:
                st.detail = units.kernel_check(remote, kernels)
    except ConnectionLost:
        raise
    except StackbuildError as err:
        rep.finish("refused", str(err), getattr(err, "exit_code", EXIT_INFRA))
        return
    if remote.dry_run:
        _stage_secrets(remote, req, paths, rep, operator=not sbs)
        _dry_plan(remote, req, svc, paths, unit, staged, rep)
        return

    baseline = incumbent_result(remote, req, svc, paths, state, incumbent_active, rep)
    pending = Pending(
        op="deploy",
        image=req.image,
        strategy=req.strategy,
        owner=me("deploy").to_json(),
        started_at=now_iso(),
    )
    with rep.step("mark pending"):
        write_state(remote, paths, state.model_copy(update={"pending": pending}))
    conv = _conv(req, svc, rep)

    try:
        _stage_secrets(remote, req, paths, rep, operator=not sbs)
        _run_candidate(
            remote,
            req,
            svc,
            paths,
            rep,
            state,
            conv,
            staged,
            unit,
            port,
            baseline,
            incumbent_active,
            text,
        )
    except ConnectionLost:
        raise
    except Exception as err:
        # Anything unexpected once the host is disturbed: put the incumbent back
        # first; a bug (not a StackbuildError) still surfaces after that.
        cause = f"deploy step failed: {(str(err) or type(err).__name__).splitlines()[0]}"
        _roll_back(remote, paths, state, conv, rep, cause, verdict="error")
        rep.finish("rolled-back", cause, getattr(err, "exit_code", EXIT_INFRA))
        if not isinstance(err, StackbuildError):
            raise


def _run_candidate(
    remote: Remote,
    req: DeployRequest,
    svc: Services,
    paths: HostPaths,
    rep: DeployReport,
    state: HostState,
    conv: converge.Converger,
    staged: str,
    unit: str,
    port: int,
    baseline: GateResult | None,
    incumbent_active: bool,
    text: str,
) -> None:
    stack = req.stack
    sbs = req.strategy == "side-by-side"
    name = unit.removesuffix(".service")
    with rep.step("start") as st:
        since = units.remote_now(remote)
        if not sbs and incumbent_active:
            conv.outage_begin()
            units.stop(remote, paths.main_unit)
        units.install(remote, staged, _runs_from(paths, sbs))  # from /run: a reboot brings back the incumbent
        units.start(remote, unit)
        st.detail = f"{unit} on port {port}"
    ready = _readiness(remote, svc, unit, port, stack, rep)
    if not ready.ok:
        logs = units.logs_since(remote, unit, name, since)
        sig = classify(f"{logs}\n{ready.detail}")
        rep.logs = logs[-8000:]
        if sig:
            rep.crash_signature, rep.crash_line = sig.kind, sig.line
        what = {
            "crashed": "candidate crashed on start",
            "generate": "candidate was ready but failed its first generation",
        }.get(ready.stage, "candidate never became ready")
        cause = f"{what}: {ready.detail}" + (f" [{sig.kind}: {sig.hint}]" if sig else "")
        _roll_back(remote, paths, state, conv, rep, cause, verdict="not-ready")
        return
    if not sbs:
        conv.outage_end()

    with rep.step("gate") as st, svc.endpoint(port) as url:
        result = svc.gate(url, req.profile, stack.label, baseline)
        if rep.host_facts:
            result = result.model_copy(update={"host": {**result.host, **rep.host_facts}})
        rep.verdict = verdict_of(result, first=baseline is None)
        rep.gate_json = result.model_dump_json()
        st.detail = f"{rep.verdict}" + (f": {'; '.join(result.reasons)[:300]}" if result.reasons else "")
    if rep.verdict != "pass":
        reasons = "; ".join([*result.reasons, *result.bars])[:500] or "no reason given"
        _roll_back(remote, paths, state, conv, rep, f"gate {rep.verdict}: {reasons}", verdict=rep.verdict)
        return

    if sbs:
        with rep.step("switch") as st:
            main_text = svc.render_unit(stack, image=req.image, port=stack.runtime.port, name=paths.service)
            main_staged = units.stage_and_verify(remote, paths.staging_dir, paths.main_unit, main_text)
            if stack.runtime.secrets:
                secrets.stage(remote, paths, stack.runtime.secrets, req.secrets, target=secrets.env_file(paths.service))
            if incumbent_active:
                conv.outage_begin()
            args = [paths.candidate_unit, _runs_from(paths, True), paths.main_unit, main_staged, paths.override_path]
            units.switch(remote, paths, args)
            text = main_text
            st.detail = f"{paths.main_unit} now runs the candidate on {stack.runtime.port}"
        ready = _readiness(remote, svc, paths.main_unit, stack.runtime.port, stack, rep)
        if not ready.ok:
            _roll_back(
                remote,
                paths,
                state,
                conv,
                rep,
                f"candidate passed the gate but failed after the switch: {ready.detail}",
                verdict="not-ready",
            )
            return
        conv.outage_end()

    with rep.step("promote") as st:
        release = Release(
            image=req.image,
            digest=req.digest,
            stack=stack.name,
            variant=stack.variant,
            unit=text,
            port=stack.runtime.port,
            verdict=rep.verdict,
            at=now_iso(),
        )
        new_state = HostState(
            service=paths.service,
            current=release,
            previous=state.current,
            last_verdict=rep.verdict,
            last_cause=None,
            last_image=req.image,
            last_at=now_iso(),
        )
        remote.run(["mkdir", "-p", f"{paths.base}/results"], what="create results dir")
        remote.put_text(result.model_dump_json(), paths.result_file(release.key))
        converge.commit(remote, paths, new_state, f"{paths.staging_dir}/{paths.main_unit}")
        st.detail = f"host state committed; {paths.main_unit} enabled (starts on boot)"
    # Committed on the host: from here nothing undoes the promotion. A channel that will not
    # move is reported stale (exit 4), never rolled back.
    if svc.promote_channel and stack.host.channel:
        stale = _move_channel(svc, req.image, stack.host.channel, rep)
        if stale:
            rep.finish("promoted", stale, EXIT_INFRA)
            return
    rep.finish("promoted")


def _runs_from(paths: HostPaths, candidate_unit: bool) -> str:
    """Where a release under test runs from: the candidate unit, or the main unit's override (both in /run)."""
    return paths.candidate_paths[0] if candidate_unit else paths.override_path


def _move_channel(svc: Services, image: str, channel: str, rep: DeployReport) -> str | None:
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


def _stage_secrets(remote: Remote, req: DeployRequest, paths: HostPaths, rep: DeployReport, *, operator: bool) -> None:
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


def _readiness(remote: Remote, svc: Services, unit: str, port: int, stack: Stack, rep: DeployReport) -> Readiness:
    with rep.step("ready") as st, svc.endpoint(port) as url:
        ready = wait_ready(
            UnitProbe(remote, unit, port, svc.http_probe(url)),
            start_deadline_s=stack.runtime.start_timeout_s,
            ready_deadline_s=stack.runtime.ready_timeout_s,
            pace=svc.pace,
        )
        st.detail = f"{ready.stage}: {ready.detail}"
    if not ready.ok:
        rep.steps[-1].ok = False
    return ready


def _roll_back(
    remote: Remote,
    paths: HostPaths,
    state: HostState,
    conv: converge.Converger,
    rep: DeployReport,
    cause: str,
    *,
    verdict: str,
) -> None:
    rep.verdict = rep.verdict or verdict
    restored = converge.to_current(remote, paths, state, conv)
    write_state(
        remote,
        paths,
        restored.model_copy(
            update={
                "last_verdict": rep.verdict,
                "last_cause": cause[:500],
                "last_image": rep.image,
                "last_at": now_iso(),
            }
        ),
    )
    rep.finish("rolled-back", cause)


def _conv(req: DeployRequest, svc: Services, rep: DeployReport) -> converge.Converger:
    return converge.converger_for(req.stack, svc.endpoint, rep, req.pull_timeout_s, http_probe=svc.http_probe,
                                  pace=svc.pace)


def _dry_plan(
    remote: Remote,
    req: DeployRequest,
    svc: Services,
    paths: HostPaths,
    unit: str,
    staged: str,
    rep: DeployReport,
) -> None:
    svc.echo(f"would mark the deploy pending in {paths.state_file}")
    if req.strategy == "swap" and units.is_active(remote, paths.main_unit):
        svc.echo(f"would stop the incumbent {paths.main_unit}")
    units.install(remote, staged, _runs_from(paths, req.strategy == "side-by-side"))
    units.start(remote, unit)
    svc.echo(f"would wait for {unit}: port, /health 200, one generation")
    svc.echo(f"would gate it with profile {req.profile.description or 'default'}")
    if svc.gate_plan is not None:
        svc.echo(svc.gate_plan(req.profile, req.strategy == "swap"))
    svc.echo(f"would promote (write {paths.state_file}) or roll back to the incumbent")
    rep.finish("planned")


def recover(remote: Remote, req: DeployRequest, svc: Services, rep: DeployReport) -> None:
    """After a lost connection: put the host back to its committed state and free the lock."""
    paths = HostPaths(req.stack.host.state_dir, req.stack.host.service)
    with HostLock(remote, paths, me(f"recover {req.stack.label}"), req.lock_ttl_s):
        state = read_state(remote, paths)
        if state.pending is None:
            rep.note("recover", True, "nothing pending")
            return
        converge.to_current(remote, paths, state, _conv(req, svc, rep))
        rep.needs_recovery = False
