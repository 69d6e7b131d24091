"""Glue between `stackbuild deploy` and the flow: image, connection, services, ledger, report.

This is the only place a deploy opens a connection (the flow receives it).
When the connection dies mid-deploy, one fresh connection is tried to put the
host back; if that fails too, the pending marker stays and the next run
converges it.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from stackbuild.effects import aio
from stackbuild.errors import EXIT_INFRA, InfraError, InputError, StackbuildError
from stackbuild.gate.result import GateResult
from stackbuild.host.deploy import deploy, recover
from stackbuild.host.dryrun import DryRunRemote
from stackbuild.host.outcome import DeployReport
from stackbuild.host.request import DeployRequest, Services
from stackbuild.host.ssh import HostAddress, SshOptions, connect, parse_host
from stackbuild.spec.profile import BUILTIN_PROFILES, GateProfile
from stackbuild.spec.stack import Stack

_PINNED = re.compile(r"^(?P<repo>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})$")


@dataclass(kw_only=True)
class RunOptions:
    """What a deploy and a fleet rollout are both given: the stack, how to connect, which image
    (None: build it), where it is pushed, how it is gated and where results go."""

    stack: Stack
    ssh: SshOptions
    image: str | None = None
    registry: str | None = None
    profile_name: str | None = None
    tunnel: bool | None = None
    ledger: Path | None = None
    root: Path | None = None
    secrets: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class DeployArgs(RunOptions):
    host_text: str
    strategy: str
    json_out: Path | None = None
    dry_run: bool = False


def deploy_args(opts: RunOptions, *, stack: Stack, host_text: str) -> DeployArgs:
    """One host's deploy within a rollout: the rollout's options, that host's stack and address."""
    common = {f.name: getattr(opts, f.name) for f in fields(RunOptions)}
    return DeployArgs(**(common | {"stack": stack}), host_text=host_text, strategy=stack.host.strategy)


def split_pinned(ref: str) -> tuple[str, str]:
    """`REPO@sha256:HEX` -> (REPO, digest); anything else is an InputError."""
    m = _PINNED.match(ref.strip())
    if not m:
        raise InputError(f"--image {ref!r}: give a pinned reference REPO@sha256:<64 hex digits>")
    return m["repo"], m["digest"]


def pin(image: str, digest: str) -> str:
    """`HOST:PORT/REPO:TAG` + digest -> `HOST:PORT/REPO@digest` (the tag dropped)."""
    repo = image.split("@", 1)[0]
    last = repo.rsplit("/", 1)[-1]
    if ":" in last:
        repo = repo[: len(repo) - len(last)] + last.split(":", 1)[0]
    return f"{repo}@{digest}"


def gate_profile(stack: Stack, name: str | None) -> GateProfile:
    chosen = name or stack.gate.default_profile
    profiles = {**BUILTIN_PROFILES, **stack.gate.profiles}
    if chosen not in profiles:
        raise InputError(
            f"--profile {chosen!r}: not a gate profile of {stack.name}; use one of {', '.join(sorted(profiles))}"
        )
    return profiles[chosen]


def resolve_image(args: DeployArgs, echo: Callable[[str], None]) -> tuple[str, str]:
    if args.image:
        return args.image, split_pinned(args.image)[1]
    if args.dry_run:
        from stackbuild.image.context import rendered_for_image
        from stackbuild.render.stack import image_ref

        ref = image_ref(args.stack, rendered_for_image(args.stack).content_hash, args.registry)
        echo(f"would build and push {ref}, then deploy it by digest")
        return pin(ref, "sha256:" + "0" * 64), "sha256:" + "0" * 64
    if not args.registry:
        raise InputError(
            f"{args.stack.source}: no registry to push the candidate to: pass "
            "--registry HOST:PORT/REPO or set host.registry (the host pulls by digest)"
        )
    from stackbuild.image.build import build_stack

    built = build_stack(args.stack, registry=args.registry, push=True)
    if not built.digest:
        raise InfraError(f"build of {args.stack.label} pushed no digest; cannot deploy by digest")
    echo(f"built {built.image} ({built.digest})")
    return pin(built.image, built.digest), built.digest


def _services(args: DeployArgs, endpoint: Any, echo: Callable[[str], None]) -> Services:
    from stackbuild.gate.runner import run_gate
    from stackbuild.render.stack import render_unit

    access = endpoint.mode

    def gate(url: str, profile: GateProfile, name: str, baseline: GateResult | None) -> GateResult:
        return run_gate(url, profile, name=name, baseline=baseline, host_facts={"access": access})

    promote: Callable[[str], str] | None = None
    if args.stack.host.channel:
        channel = args.stack.host.channel

        def promote(ref: str) -> str:
            from stackbuild.image import registry

            registry.promote(ref, channel=channel)
            return f"{channel} -> {ref}"

    def progress(text: str) -> None:
        print(f"stackbuild: deploy: {text}", file=sys.stderr, flush=True)

    def gate_plan(profile: GateProfile, stored: bool) -> str:
        from stackbuild.results.ledger import default_ledger_path
        from stackbuild.results.ledger import gate_plan as plan

        return plan(profile, args.ledger or default_ledger_path(args.root or Path.cwd()), stored=stored)

    return Services(
        progress=progress,
        render_unit=render_unit,
        gate=gate,
        endpoint=endpoint,
        promote_channel=promote,
        echo=echo,
        access=access,
        gate_plan=gate_plan,
    )


@dataclass
class Endpoint:
    remote: Any
    address: HostAddress
    tunnel: bool | None

    @property
    def mode(self) -> str:
        use = (not self.address.is_loopback) if self.tunnel is None else self.tunnel
        return "tunnel" if use else "direct"

    def __call__(self, port: int) -> Any:
        from contextlib import contextmanager

        @contextmanager
        def cm() -> Any:
            if self.mode == "direct" or getattr(self.remote, "dry_run", False):
                host = self.address.host if self.address.is_loopback else "127.0.0.1"
                yield f"http://{host}:{port}"
                return
            with self.remote.forward(port) as local_port:
                yield f"http://127.0.0.1:{local_port}"

        return cm()


def run_deploy(
    args: DeployArgs,
    echo: Callable[[str], None] = print,
    reports: list[DeployReport] | None = None,
) -> int:
    address = parse_host(args.host_text)
    profile = gate_profile(args.stack, args.profile_name)
    check_local_outputs(args)
    # the connection and the host key first: a build can take hours, a refused key seconds
    real = connect(address, args.ssh)
    if not args.image and not args.dry_run:
        real.close()  # an hours-long build would outlive an idle connection
        image, digest = resolve_image(args, echo)
        real = connect(address, args.ssh)
    else:
        image, digest = resolve_image(args, echo)
    remote: Any = DryRunRemote(str(address), reader=real, echo=echo) if args.dry_run else real
    endpoint = Endpoint(remote, address, args.tunnel)
    svc = _services(args, endpoint, echo)
    req = DeployRequest(
        stack=args.stack,
        image=image,
        digest=digest,
        strategy=args.strategy,
        profile=profile,
        secrets=args.secrets,
        need_free_kib=(1 if args.stack.runtime.gpus == "none" else 64) * 2**20,
    )
    try:
        with restore_on_signal():
            rep = deploy(remote, req, svc)
    finally:
        remote.close()
    if rep.needs_recovery:
        rep = _recover_once(address, args, req, svc, rep, echo)
    if not args.dry_run:
        _record(args, rep, profile, digest, echo)
    echo(rep.render())
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


def check_local_outputs(args: DeployArgs) -> None:
    """Every file the deploy will write, opened now: after the host changed is too late."""
    from stackbuild.results.outputs import check_ledger, check_writable

    if args.json_out:
        check_writable(args.json_out, "--json")
    if not args.dry_run:
        from stackbuild.results.ledger import default_ledger_path

        check_ledger(args.ledger or default_ledger_path(args.root or Path.cwd()))


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
        remote = connect(address, args.ssh)
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
    args: DeployArgs, rep: DeployReport, profile: GateProfile, digest: str, echo: Callable[[str], None]
) -> None:
    from stackbuild.results.ledger import Ledger, default_ledger_path, host_class_of
    from stackbuild.results.writer import update_report

    path = args.ledger or default_ledger_path(args.root or Path.cwd())
    path.parent.mkdir(parents=True, exist_ok=True)
    outcome = rep.outcome if rep.outcome in ("promoted", "rolled-back", "refused") else "failed"
    with Ledger(path) as ledger:
        if rep.gate_json:
            ledger.record_gate(GateResult.model_validate_json(rep.gate_json))
        ledger.record_deploy(
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
    try:
        echo(f"report: {update_report(path)}")
    except StackbuildError as err:
        echo(f"stackbuild: ledger recorded; report not updated ({err})")
