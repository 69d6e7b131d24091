"""Glue between `stackbuild deploy|status|rollback --host` and the flow: image, connection,
services, ledger, report.

This is the only place a deploy, rollback or status opens a connection (the flow receives
it), through a `Reach`. When the connection dies mid-deploy, one fresh connection is tried
to put the host back; if that fails too, the pending marker stays and the next run
converges it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from stackbuild.effects import aio
from stackbuild.errors import EXIT_INFRA, InfraError, InputError, StackbuildError
from stackbuild.gate.result import GateResult
from stackbuild.host import gateway
from stackbuild.host.converge import Converger, HostStatus, rollback, status
from stackbuild.host.deploy import deploy, recover
from stackbuild.host.dryrun import DryRunRemote
from stackbuild.host.outcome import DeployReport
from stackbuild.host.reach import Endpoint, Reach, gateway_link, gateway_target
from stackbuild.host.request import DeployRequest, Services
from stackbuild.host.ssh import HostAddress, Remote, SshOptions, parse_host
from stackbuild.host.state import HostPaths, new_run, only_service
from stackbuild.image import registry
from stackbuild.image.build import BuildResult, build_stack
from stackbuild.image.context import rendered_for_image
from stackbuild.image.gateway import build_gateway
from stackbuild.image.ref import pin, split_pinned
from stackbuild.render.gateway import pool_urls
from stackbuild.render.stack import image_ref, render_unit
from stackbuild.results.display import Display, Log, Note, Result, Sink, bind
from stackbuild.results.ledger import gate_plan as ledger_gate_plan
from stackbuild.results.ledger import host_class_of, ledger_path
from stackbuild.results.outage import swap_outage
from stackbuild.results.outputs import check_writable
from stackbuild.results.recorder import Recorder
from stackbuild.results.steplog import StepLog, deploy_log_path
from stackbuild.spec.profile import BUILTIN_PROFILES, GateProfile
from stackbuild.spec.stack import Stack

__all__ = ["Endpoint", "Reach"]  # their home is host/reach.py; callers import them from here too


@dataclass(kw_only=True)
class RunOptions:
    """What a deploy and a fleet rollout are both given: the stack, how to connect, which image
    (None: build it), where it is pushed, how it is gated, where results go, how hosts are reached."""

    stack: Stack
    ssh: SshOptions
    image: str | None = None
    registry: str | None = None
    profile_name: str | None = None
    tunnel: bool | None = None
    ledger: Path | None = None
    root: Path | None = None
    secrets: dict[str, str] = field(default_factory=dict)
    reach: Reach = field(default_factory=Reach)
    gateway_image: str | None = None  # the gateway's, pinned (None: built, or found in the registry, when needed)
    gateway_host: str | None = None  # where the gateway runs, resolved (None: gateway.host, else the deploy's host)
    drained: bool = False  # a rollout drained the host out of the gateway (and brought the gateway up) first
    prune_workers: bool = False  # workers in the gateway that stackbuild did not put there are removed
    progress: bool = False  # a live view on the terminal (results/display.py); else plain lines
    # who owns the host leases it takes: "" a deploy of its own (host/state.py new_run), else ROLLOUT/HOST
    lock_run: str = ""

    @property
    def recorder_path(self) -> Path:
        return ledger_path(self.ledger, self.root)


@dataclass(kw_only=True)
class DeployArgs(RunOptions):
    host_text: str
    strategy: str
    json_out: Path | None = None
    dry_run: bool = False
    report: bool = True  # refresh the report once recorded (a rollout's hosts: once, when it ends)


def deploy_args(opts: RunOptions, *, stack: Stack, host_text: str) -> DeployArgs:
    """One host's deploy within a rollout: the rollout's options, that host's stack and address."""
    common = {f.name: getattr(opts, f.name) for f in fields(RunOptions)}
    return DeployArgs(**(common | {"stack": stack}), host_text=host_text, strategy=stack.host.strategy,
                      report=False)


def gate_profile(stack: Stack, name: str | None) -> GateProfile:
    chosen = name or stack.gate.default_profile
    profiles = {**BUILTIN_PROFILES, **stack.gate.profiles}
    if chosen not in profiles:
        raise InputError(
            f"--profile {chosen!r}: not a gate profile of {stack.name}; use one of {', '.join(sorted(profiles))}"
        )
    return profiles[chosen]


def resolve_image(args: DeployArgs, echo: Callable[[str], None],
                  build: Callable[..., BuildResult] = build_stack) -> tuple[str, str]:
    """The pinned image to deploy and its digest: --image as given, else the stack built, pushed and
    recorded in the ledger's builds table like any `stackbuild build`."""
    if args.image:
        return args.image, split_pinned(args.image)[1]
    if args.dry_run:
        ref = image_ref(args.stack, rendered_for_image(args.stack).content_hash, args.registry)
        echo(f"would build and push {ref}, then deploy it by digest")
        return pin(ref, "sha256:" + "0" * 64), "sha256:" + "0" * 64
    if not args.registry:
        raise InputError(
            f"{args.stack.source}: no registry to push the candidate to: pass "
            "--registry HOST:PORT/REPO or set host.registry (the host pulls by digest)"
        )
    built = build(args.stack, registry=args.registry, push=True)
    if not built.digest:
        raise InfraError(f"build of {args.stack.label} pushed no digest; cannot deploy by digest")
    echo(f"built {built.image} ({built.digest})")
    Recorder(args.recorder_path, note=echo).build(args.stack, built)
    return pin(built.image, built.digest), built.digest


def resolve_gateway_image(args: RunOptions, echo: Callable[[str], None], *, dry_run: bool = False) -> str | None:
    """The gateway image (stack with a gateway: section): as given, else built and pushed unless the
    registry has it (it is named by the hash of what goes into it)."""
    if args.stack.gateway is None or args.gateway_image:
        return args.gateway_image
    where = args.registry or args.stack.host.registry
    if not where:
        raise InputError(f"{args.stack.source}: the gateway's image needs a registry the host pulls from: pass "
                         "--registry HOST:PORT/REPO or set host.registry")
    return build_gateway(args.stack, where, echo=echo, dry_run=dry_run)


def _services(args: DeployArgs, endpoint: Endpoint, remote: Remote, echo: Callable[[str], None],
              feed: Sink) -> Services:
    promote: Callable[[str], str] | None = None
    if args.stack.host.channel:
        channel = args.stack.host.channel

        def promote(ref: str) -> str:
            registry.promote(ref, channel=channel)
            return f"{channel} -> {ref}"

    def gate_plan(profile: GateProfile, stored: bool) -> str:
        return ledger_gate_plan(profile, ledger_path(args.ledger, args.root), stored=stored)

    def outage_plan() -> str:
        return swap_outage(ledger_path(args.ledger, args.root), args.stack)

    return Services(
        progress=feed,
        render_unit=render_unit,
        gate=args.reach.gate(remote, endpoint.mode),
        endpoint=endpoint,
        http_probe=args.reach.http_probe(remote),
        pace=args.reach.pace(remote),
        promote_channel=promote,
        echo=echo,
        access=endpoint.mode,
        gate_plan=gate_plan,
        outage_plan=outage_plan,
    )


def run_deploy(
    args: DeployArgs,
    echo: Callable[[str], None] = print,
    reports: list[DeployReport] | None = None,
    sink: Sink | None = None,
) -> int:
    """One deploy. On its own (no `sink`) it owns the display and a step log of its own: a live
    line (or plain stage lines) while it runs, its summary at the end. A rollout's host feeds the
    rollout's `sink` (display and log) instead, its whole report included; `echo` is then the
    rollout's log too."""
    address = parse_host(args.host_text)
    profile = gate_profile(args.stack, args.profile_name)
    check_local_outputs(args)
    with ExitStack() as stack:
        log, own = None, None
        if sink is None:
            if not args.dry_run:  # opened before the host: an unwritable log is exit 2, nothing touched
                log = stack.enter_context(StepLog(deploy_log_path(args.recorder_path, args.stack.label),
                                                  args.secrets.values()).open())
            sink = own = Display(echo=echo, live=args.progress and not args.dry_run, log=log,
                                 title=f"deploy {args.stack.label} -> {address} ({args.strategy})")
            echo = own.note
        if log:
            echo(f"step log: {log.path}")
        feed = bind(sink, str(address))
        rep, digest = _deploy_on(args, address, profile, feed, echo, own or nullcontext())
        if own:
            own.echo(rep.render(full=args.dry_run) + (f"\n  step log: {log.path}" if log else ""))
        if not args.dry_run:  # after the outcome: a ledger that fails now is a warning (results/recorder.py)
            _record(args, rep, profile, digest, echo, warn=echo if own else lambda text: feed(Note(text)))
        if args.json_out:
            try:
                args.json_out.write_text(rep.to_json())
            except OSError as err:  # checked writable before the host; gone since
                echo(f"stackbuild: deploy report not written to {args.json_out} ({err.strerror})")
        if rep.exit_code and rep.cause:
            echo(f"stackbuild: deploy {rep.outcome}: {rep.cause.splitlines()[0]}")
    if reports is not None:
        reports.append(rep)
    return rep.exit_code


def _deploy_on(args: DeployArgs, address: HostAddress, profile: GateProfile, feed: Sink,
               echo: Callable[[str], None], view: AbstractContextManager[object]) -> tuple[DeployReport, str]:
    """Connect, build unless pinned, run the flow inside `view` (the live view, entered after the
    builds drew their own) behind the stack's gateway, and put the host back once if the
    connection died."""
    # the connection and the host key first: a build can take hours, a refused key seconds
    real = args.reach.connect(address, args.ssh)
    if not args.image and not args.dry_run:
        real.close()  # an hours-long build would outlive an idle connection
        image, digest = resolve_image(args, echo)
        real = args.reach.connect(address, args.ssh)
    else:
        image, digest = resolve_image(args, echo)
    gw_image = None if args.drained else resolve_gateway_image(args, echo, dry_run=args.dry_run)
    remote: Remote = DryRunRemote(str(address), reader=real, echo=echo) if args.dry_run else real
    endpoint = Endpoint(remote, address, args.tunnel)
    svc = _services(args, endpoint, real, echo, feed)
    req = DeployRequest(
        stack=args.stack,
        image=image,
        digest=digest,
        strategy=args.strategy,
        profile=profile,
        secrets=args.secrets,
        run=args.lock_run or new_run(),
    )
    at = args.gateway_host or gateway_target(args.stack, {h.name: h.target for h in args.stack.host.hosts},
                                             args.host_text)
    with view:
        try:
            with restore_on_signal(), gateway_link(args.reach, args.ssh, args.tunnel, args.stack, gateway_at=at,
                                                   server_at=args.host_text, server=remote, endpoint=endpoint,
                                                   image=gw_image, kept_out=args.drained,
                                                   prune=args.prune_workers) as link:
                svc.gateway = link
                rep = deploy(remote, req, svc)
        finally:
            remote.close()
        svc.gateway = None  # its connection is gone: a recovery puts the host back, the next deploy the pool
        if rep.needs_recovery:
            rep = _recover_once(address, args, req, svc, rep, echo)
        feed(Result(str(address), rep.outcome, rep.verdict))
    feed(Log(rep.render()))
    return rep, digest


def check_local_outputs(args: DeployArgs) -> None:
    """Every file the deploy will write, opened now: after the host changed is too late."""
    if args.json_out:
        check_writable(args.json_out, "--json")
    if not args.dry_run:
        Recorder(args.recorder_path).check()


class Interrupted(StackbuildError):
    """SIGTERM/SIGINT mid-deploy: raised where the deploy is, so it puts the incumbent back first.

    Not an InfraError: code that tolerates an infrastructure failure (a probe that could not
    reach the server, say) must not swallow it."""

    exit_code = EXIT_INFRA


@contextmanager
def restore_on_signal() -> Iterator[None]:
    """Turn the first SIGTERM/SIGINT into `Interrupted`; ignore more while the host is restored.

    The flow catches it like any failure once the host is disturbed: it restores the
    incumbent, releases the lock and reports, then the command exits 4.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGTERM, signal.SIGINT)
    old = {s: signal.getsignal(s) for s in sigs}

    def handler(signum: int, _frame: object) -> None:
        for s in sigs:
            signal.signal(s, signal.SIG_IGN)  # a second signal must not cut the restore short

        def interrupt() -> None:
            raise Interrupted(f"interrupted by {signal.Signals(signum).name}; the incumbent is put back before exit")

        aio.deliver(interrupt)  # not inside an event loop's construction (effects/aio.py)

    for s in sigs:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _recover_once(
    address: HostAddress,
    args: DeployArgs,
    req: DeployRequest,
    svc: Services,
    rep: DeployReport,
    echo: Callable[[str], None],
) -> DeployReport:
    echo("stackbuild: the SSH connection died mid-deploy; reconnecting once to restore the host")
    try:
        remote = args.reach.connect(address, args.ssh)
    except StackbuildError as err:
        rep.cause = f"{rep.cause}; reconnect failed too ({str(err).splitlines()[0]}): re-run"
        return rep
    svc.endpoint = Endpoint(remote, address, args.tunnel)
    try:
        recover(remote, req, svc, rep)
        rep.note("recovered", True, "host restored to its committed state over a new connection")
    except StackbuildError as err:
        rep.note("recovered", False, str(err).splitlines()[0])
    finally:
        remote.close()
    rep.exit_code = EXIT_INFRA
    return rep


def _record(
    args: DeployArgs, rep: DeployReport, profile: GateProfile, digest: str, echo: Callable[[str], None],
    warn: Callable[[str], None],
) -> None:
    outcome = rep.outcome if rep.outcome in ("promoted", "rolled-back", "refused") else "failed"
    Recorder(args.recorder_path, note=echo, warn=warn, report=args.report).deploy(
        GateResult.model_validate_json(rep.gate_json) if rep.gate_json else None,
        host=rep.host,
        stack=args.stack.name,
        variant=args.stack.variant,
        image=rep.image,
        digest=digest,
        strategy=rep.strategy,
        outcome=outcome,  # type: ignore[arg-type]
        crash_signature=rep.crash_signature,
        durations=rep.durations(),
        downtime_s=rep.downtime_s,
        cause=rep.cause,
        fingerprint=profile.workload().fingerprint(),
        host_class=host_class_of(rep.host_facts) if rep.host_facts else None,
    )


def read_status(host_text: str, ssh: SshOptions, *, service: str | None, state_dir: str,
                reach: Reach | None = None) -> tuple[HostAddress, HostStatus]:
    """`stackbuild status --host`: what the host runs (the only service it has state for when none is named)."""
    address = parse_host(host_text)
    reach = reach or Reach()
    remote = reach.connect(address, ssh)
    try:
        st = status(remote, HostPaths(state_dir, service or only_service(remote, state_dir)))
        lines = [ln for rec in gateway.records(remote, state_dir)
                 for ln in gateway_lines(reach, remote, Endpoint(remote, address, None), rec)]
        return address, replace(st, gateways=tuple(lines))
    finally:
        remote.close()


def gateway_lines(reach: Reach, remote: Remote, endpoint: Endpoint, rec: gateway.GatewayRecord,
                  names: dict[str, str] | None = None) -> list[str]:
    """What a gateway on a host says of its workers (GET /workers), in lines for `status`."""
    head = f"  gateway {rec.service} on port {rec.port} ({rec.image.rsplit('@', 1)[-1][:19]})"
    try:
        with endpoint(rec.port) as url:
            key = gateway.control_key(remote, rec.service, create=False)
            workers = reach.gateway_api(remote, url, key).workers()
    except StackbuildError as err:
        return [f"{head}: NOT answering ({str(err).splitlines()[0][:160]})"]
    ours = set(pool_urls(gateway.read_pool(remote, rec.service)))
    odd = [w.url for w in workers if w.url not in ours]
    warn = [f"  WARNING: {len(odd)} worker(s) in the gateway that stackbuild did not put there"] if odd else []
    return [f"{head}: {len(workers)} worker(s)", *gateway.describe(workers, names, ours), *warn]


def run_rollback(host_text: str, ssh: SshOptions, *, service: str | None, state_dir: str, timeout_s: float,
                 tunnel: bool | None, dry_run: bool, echo: Callable[[str], None] = print,
                 reach: Reach | None = None, stack: Stack | None = None) -> DeployReport:
    """`stackbuild rollback`: the previous release made current again, verified serving within
    `timeout_s`, under the host lease (converge.rollback). `stack` (`--stack`): its gateway, if it has
    one, drains what stops and takes the restored release back in."""
    reach = reach or Reach()
    address = parse_host(host_text)
    real = reach.connect(address, ssh)
    remote: Remote = DryRunRemote(str(address), reader=real, echo=echo) if dry_run else real
    endpoint = Endpoint(remote, address, tunnel)
    try:
        paths = HostPaths(state_dir, service or only_service(real, state_dir))
        rep = DeployReport(host=str(address), service=paths.service, stack="-", image="-", strategy="rollback")
        conv = Converger(endpoint=endpoint, report=rep, start_timeout_s=timeout_s,
                         ready_timeout_s=timeout_s, http_probe=reach.http_probe(real), pace=reach.pace(real))
        at = gateway_target(stack, {h.name: h.target for h in stack.host.hosts}, host_text) if stack else host_text
        with (gateway_link(reach, ssh, tunnel, stack, gateway_at=at, server_at=host_text, server=remote,
                           endpoint=endpoint) if stack else nullcontext()) as link:
            conv.link = link
            rollback(remote, paths, conv)
    finally:
        remote.close()
    return rep
