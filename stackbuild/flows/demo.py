"""`stackbuild demo`: the whole pipeline on this machine, then the results table.

Infra (dockerd, registry, base and test-host images) -> build the sim stack
with BuildKit and push it -> start a systemd+sshd host container on 127.0.0.1
-> deploy the baseline (first deploy: absolute bars), then candidates that the
gate judges against it: a better one is promoted, a slower and a crashing one
are rolled back -> print the results table from the ledger. The stack's gateway
(smg) fronts the host: its URL is printed once the baseline serves, and the
demo's own client streams completions through it until the end, then says how
many it sent and how many failed.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import click

from stackbuild.errors import InfraError
from stackbuild.flows.demo_gateway import client, gateway_port, on_port
from stackbuild.host.outcome import DeployReport

# (variant, what the demo shows with it)
SEQUENCE: tuple[tuple[str, str], ...] = (
    ("baseline", "first deploy: absolute bars only, promoted"),
    ("eagle3-topk1-v2", "a candidate gated against the incumbent on the same host"),
    ("slower", "a slower candidate: the gate fails, the incumbent is put back"),
    ("crash-on-start", "a crashing candidate: classified, rolled back"),
)
HOST_CONTAINER = "stackbuild-demo-host"


def run_demo(root_opt: Path | None, live: bool, keep_host: bool, registry: str, host_name: str, fleet_n: int | None,
             echo: Callable[[str], None] = click.echo) -> None:
    """Whole pipeline on the local sim stack and a local test host; prints the results table."""
    from stackbuild.flows.deploy_host import DeployArgs, run_deploy
    from stackbuild.host import local
    from stackbuild.host.ssh import SshOptions
    from stackbuild.image.ref import pin
    from stackbuild.paths import stack_root
    from stackbuild.spec.load import load_stack

    root = stack_root(root_opt)
    _ensure_infra(root, echo)
    base = load_stack("sim", root=root_opt)
    echo(f"demo: building {base.label} with BuildKit and pushing it to {registry}")
    from stackbuild.image.build import build_stack
    from stackbuild.results.ledger import default_ledger_path
    from stackbuild.results.recorder import Recorder

    ledger = default_ledger_path(root)
    recorder = Recorder(ledger)
    recorder.check()
    # the build's lines are in its log: a line per stage here, or its bars on a terminal
    built = build_stack(base, registry=registry, push=True, progress="tty" if live else "stages")
    if not built.digest:
        raise InfraError("demo: the build pushed no digest; cannot deploy by digest")
    image = pin(built.image, built.digest)
    echo(f"demo: image {image}")
    recorder.build(base, built)
    if fleet_n:
        from stackbuild.flows.demo_fleet import run_demo_fleet

        run_demo_fleet(fleet_n, root, root_opt, image, registry, ledger, keep_host, echo,
                       progress=live)
        return

    work = root / ".stackbuild" / "demo"
    host = local.start(work, name=host_name)
    echo(f"demo: host container {host.container} on {host.target}")
    reports: list[DeployReport] = []
    ssh = SshOptions(known_hosts=host.known_hosts, key_filename=str(host.key))
    codes: list[tuple[str, int]] = []
    port = gateway_port(base)
    try:
        with ExitStack() as during:
            for variant, what in SEQUENCE:
                if variant not in base.variants:
                    continue
                echo(f"\n=== deploy {base.name} --variant {variant}: {what}")
                stack = on_port(load_stack("sim", root=root_opt, variant=variant), port)
                args = DeployArgs(
                    stack=stack,
                    host_text=host.target,
                    ssh=ssh,
                    strategy=stack.host.strategy,
                    image=image,
                    registry=registry,
                    ledger=ledger,
                    root=root,
                    progress=live,
                )
                codes.append((variant, run_deploy(args, echo=echo, reports=reports)))
                if len(codes) == 1 and codes[0][1] == 0:  # the baseline serves: so does the gateway
                    during.enter_context(client(port, echo))
    finally:
        if not keep_host:
            local.stop(host, (base.host.service, *([base.gateway.service] if base.gateway else [])))
    echo("\n=== results")
    report = recorder.refresh()
    if report is None:  # not written (warned): a table of this run's deploys instead
        echo(deploy_table(reports))
    else:
        echo(f"({report})\n")
        echo(report.read_text())
    echo("demo: exit codes: " + ", ".join(f"{v}={c}" for v, c in codes))
    if codes and codes[0][1] != 0:
        raise InfraError(f"demo: the first deploy ({codes[0][0]}) was not promoted; see its report above for the cause")


def deploy_table(reports: list[DeployReport]) -> str:
    rows = ["| config | outcome | exit | verdict | downtime s | cause |", "|---|---|---|---|---|---|"]
    for r in reports:
        cause = (r.cause or "").splitlines()[0].replace("|", "/")[:90] if r.cause else ""
        down = f"{r.downtime_s:.2f}" if r.downtime_s is not None else ""
        rows.append(f"| {r.stack} | {r.outcome} | {r.exit_code} | {r.verdict or ''} | {down} | {cause} |")
    return "\n".join(rows)


def _ensure_infra(root: Path, echo: Callable[[str], None]) -> None:
    """dockerd, registry and images up (what `make demo` did already); else run up.sh."""
    from stackbuild.effects import proc

    ok = proc.run(["/usr/bin/docker", "info"], check=False, timeout=20).returncode == 0
    have = (
        ok
        and proc.run(
            ["/usr/bin/docker", "image", "inspect", "local/stackbuild-testhost:bookworm"], check=False
        ).returncode
        == 0
    )
    if have:
        return
    script = root / "scripts" / "infra" / "up.sh"
    if not script.exists():
        raise InfraError(
            "demo: dockerd/registry/images are not up and scripts/infra/up.sh is "
            "not here; run `make demo` from the project checkout"
        )
    echo("demo: bringing up local infrastructure (scripts/infra/up.sh)")
    proc.run(["bash", str(script)], timeout=1800, what="scripts/infra/up.sh")
