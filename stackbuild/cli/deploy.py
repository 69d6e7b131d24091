"""`stackbuild deploy|status|rollback --host`: thin wrappers over stackbuild.host.

Heavy imports (fabric, docker, aiohttp) happen inside the functions.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from stackbuild.cli.progress import progress_option, wants_live
from stackbuild.errors import InputError

if TYPE_CHECKING:
    from stackbuild.spec.stack import Stack

_SSH_OPTIONS = [
    click.option(
        "--host",
        "host_text",
        default=None,
        help="[USER@]HOST[:PORT] or an ~/.ssh/config alias (default: the spec's host).",
    ),
    click.option(
        "--accept-new-host-key", is_flag=True, help="Trust an unknown host key on first use (appended to known_hosts)."
    ),
    click.option(
        "--known-hosts",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="known_hosts file (default ~/.ssh/known_hosts).",
    ),
    click.option(
        "--identity",
        type=click.Path(dir_okay=False),
        default=None,
        help="Private key (default: ~/.ssh/config IdentityFile, agent, ~/.ssh/id_*).",
    ),
    click.option(
        "--connect-timeout",
        type=click.FloatRange(min=1),
        default=10.0,
        show_default=True,
        help="Seconds to open the SSH connection.",
    ),
]


def ssh_options(f: Any) -> Any:
    for opt in reversed(_SSH_OPTIONS):
        f = opt(f)
    return f


def _ssh_opts(accept_new: bool, known_hosts: Path | None, identity: str | None, connect_timeout: float) -> Any:
    from stackbuild.host.ssh import SshOptions

    if identity and not Path(identity).expanduser().is_file():
        raise InputError(f"--identity {identity}: no such key file; pass the path of your private key")

    return SshOptions(
        connect_timeout_s=connect_timeout,
        accept_new_host_key=accept_new,
        known_hosts=known_hosts,
        key_filename=identity,
    )


def _root(ctx: click.Context) -> Path:
    from stackbuild.paths import stack_root

    return stack_root((ctx.obj or {}).get("root"))


@click.command("deploy")
@click.argument("stack_name", metavar="STACK")
@ssh_options
@click.option("--variant", default=None, help="Variant of the stack to deploy.")
@click.option(
    "--strategy",
    type=click.Choice(["swap", "side-by-side"]),
    default=None,
    help="swap: stop the incumbent, start the candidate; side-by-side: staging port.",
)
@click.option("--image", default=None, help="Deploy this pinned image (REPO@sha256:...) instead of building the stack.")
@click.option("--registry", default=None, help="HOST:PORT/REPO to push to and pull from.")
@click.option("--profile", "profile_name", default=None, help="Gate profile (default: the spec's).")
@click.option(
    "--tunnel/--no-tunnel",
    default=None,
    help="Reach the server through an SSH tunnel (default: unless the host is loopback).",
)
@click.option(
    "--ledger",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Ledger file (default: .stackbuild/ledger.db under the project root).",
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the deploy report as JSON here.",
)
@click.option("--dry-run", is_flag=True, help="Print every remote command; change nothing.")
@click.option(
    "--fleet", is_flag=True, help="Roll out to every host of the stack's fleet: canary, then gated, soaked waves."
)
@click.option(
    "--hosts", "hosts_csv", default=None, help="With --fleet: only these hosts (inventory names or addresses), a,b,c."
)
@click.option(
    "--inventory",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --fleet: a YAML file of hosts (default: host.inventory or host.hosts of the spec).",
)
@click.option(
    "--on-failure",
    type=click.Choice(["halt", "rollback_all"]),
    default=None,
    help="With --fleet: on a failed wave, keep earlier waves (halt) or take them back too (default: the spec's).",
)
@click.option("--allow-outage", is_flag=True,
              help="With --fleet: go ahead with a wave that takes every host of the gateway's pool out at once "
                   "(a 1-host fleet); the plan says how long clients get errors. Without it such a rollout is "
                   "refused (exit 2).")
@click.option("--soak", "soak_s", type=click.FloatRange(min=0), default=None,
              help="With --fleet: seconds to watch each wave after it is promoted (default: host.fleet.soak_s).")
@click.option("--prune-workers", is_flag=True,
              help="Remove workers the gateway routes to that stackbuild did not put there (default: name them).")
@progress_option
@click.pass_context
def deploy_cmd(
    ctx: click.Context,
    stack_name: str,
    host_text: str | None,
    accept_new_host_key: bool,
    known_hosts: Path | None,
    identity: str | None,
    connect_timeout: float,
    variant: str | None,
    strategy: str | None,
    image: str | None,
    registry: str | None,
    profile_name: str | None,
    tunnel: bool | None,
    ledger: Path | None,
    json_out: Path | None,
    dry_run: bool,
    fleet: bool,
    hosts_csv: str | None,
    inventory: Path | None,
    on_failure: str | None,
    soak_s: float | None,
    allow_outage: bool,
    prune_workers: bool,
    show_progress: bool | None,
) -> None:
    """Deploy STACK to a host over SSH, gate it against the incumbent, promote or roll back.

    With --fleet: to every host of the fleet, a canary first, then waves (see README "Fleet").
    While it runs: a live line per host (plain lines when not on a terminal); every step goes to
    a log file beside the ledger, whose path is printed.
    """
    from stackbuild.flows.deploy_host import DeployArgs, run_deploy
    from stackbuild.spec.load import load_stack

    stack = load_stack(stack_name, root=(ctx.obj or {}).get("root"), variant=variant)
    _validate_fully(stack)
    _refuse_misplaced(stack, strategy=strategy, allow_outage=allow_outage, fleet=fleet,
                      fleet_only=bool(hosts_csv or inventory), host_text=host_text, json_out=json_out)
    ssh = _ssh_opts(accept_new_host_key, known_hosts, identity, connect_timeout)
    if fleet:
        from stackbuild.flows.rollout import FleetArgs, run_fleet

        fargs = FleetArgs(
            stack=stack, ssh=ssh,
            hosts=[h.strip() for h in hosts_csv.split(",") if h.strip()] if hosts_csv else None,
            inventory=inventory, on_failure=on_failure, soak_s=soak_s, allow_outage=allow_outage, dry_run=dry_run,
            image=image, registry=registry or stack.host.registry, profile_name=profile_name, tunnel=tunnel,
            ledger=ledger, root=_root(ctx), secrets=_secrets(stack), progress=wants_live(show_progress),
            prune_workers=prune_workers,
        )
        _exit(run_fleet(fargs, echo=click.echo))
        return
    args = DeployArgs(
        stack=stack, host_text=host_text or stack.host.address or "", ssh=ssh,
        strategy=strategy or stack.host.strategy, image=image, registry=registry or stack.host.registry,
        profile_name=profile_name, tunnel=tunnel, ledger=ledger, root=_root(ctx), json_out=json_out,
        dry_run=dry_run, secrets=_secrets(stack), progress=wants_live(show_progress), prune_workers=prune_workers,
    )
    if not args.host_text:
        raise InputError(f"{stack.source}: no host: pass --host [USER@]HOST[:PORT] or set host.address in the spec")
    _exit(run_deploy(args, echo=click.echo))


def _refuse_misplaced(stack: Stack, *, strategy: str | None, allow_outage: bool, fleet: bool, fleet_only: bool,
                      host_text: str | None, json_out: Path | None) -> None:
    """Refuse (exit 2), before any host is touched: a side-by-side that cannot fit, and options given
    where they do not apply (a fleet's options without --fleet, a single host's with it)."""
    from stackbuild.host.fit import check_side_by_side

    check_side_by_side(stack, strategy or stack.host.strategy)
    if allow_outage and not fleet:
        raise InputError("--allow-outage is for --fleet: a single deploy states its own outage (swap) and has none "
                         "behind a gateway (side-by-side)")
    if (fleet or fleet_only) and (not fleet or host_text or strategy or json_out):
        raise InputError("--hosts/--inventory need --fleet; --fleet takes no --host, --strategy "
                         "or --json (per-host settings live in the inventory)")


def _secrets(stack: Stack) -> dict[str, str]:
    """The runtime secrets the spec names, from this process's environment (those that are set)."""
    return {n: os.environ[n] for n in stack.runtime.secrets if n in os.environ}


@click.command("status")
@ssh_options
@click.option("--service", default=None, help="Service name on the host (default: the only one it has).")
@click.option("--state-dir", default="/var/lib/stackbuild", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the host state as JSON.")
@click.option("--fleet", "fleet_stack", metavar="STACK", default=None,
              help="Every host of STACK's fleet: release, digest, last verdict, locks; and its last rollout.")
@click.option("--hosts", "hosts_csv", default=None, help="With --fleet: only these hosts, a,b,c.")
@click.option("--inventory", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --fleet: a YAML file of hosts.")
@click.option("--ledger", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="With --fleet: ledger file (default: .stackbuild/ledger.db under the project root).")
@click.pass_context
def status_cmd(
    ctx: click.Context,
    host_text: str | None,
    accept_new_host_key: bool,
    known_hosts: Path | None,
    identity: str | None,
    connect_timeout: float,
    service: str | None,
    state_dir: str,
    as_json: bool,
    fleet_stack: str | None,
    hosts_csv: str | None,
    inventory: Path | None,
    ledger: Path | None,
) -> None:
    """What a host runs, which digest, the last verdict (--fleet STACK: every host of a fleet)."""
    if fleet_stack:
        _fleet_status(ctx, fleet_stack, _ssh_opts(accept_new_host_key, known_hosts, identity, connect_timeout),
                      hosts_csv, inventory, ledger)
        return
    from stackbuild.flows.deploy_host import read_status

    ssh = _ssh_opts(accept_new_host_key, known_hosts, identity, connect_timeout)
    address, st = read_status(_need_host(host_text), ssh, service=service, state_dir=state_dir)
    click.echo(st.state.model_dump_json(indent=2) if as_json else st.render(str(address)))


@click.command("rollback")
@ssh_options
@click.option("--service", default=None, help="Service name on the host (default: the only one it has).")
@click.option("--state-dir", default="/var/lib/stackbuild", show_default=True)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Seconds the previous release may take to serve again.",
)
@click.option("--tunnel/--no-tunnel", default=None)
@click.option("--dry-run", is_flag=True, help="Print every remote command; change nothing.")
@click.option("--stack", "stack_name", metavar="STACK", default=None,
              help="The host's stack: behind its gateway, what stops is drained first and the restored release "
                   "put back in the pool.")
@click.pass_context
def rollback_cmd(
    ctx: click.Context,
    host_text: str | None,
    accept_new_host_key: bool,
    known_hosts: Path | None,
    identity: str | None,
    connect_timeout: float,
    service: str | None,
    state_dir: str,
    timeout_s: float,
    tunnel: bool | None,
    dry_run: bool,
    stack_name: str | None,
) -> None:
    """Put the previous image back on a host, verified serving."""
    from stackbuild.flows.deploy_host import run_rollback
    from stackbuild.spec.load import load_stack

    stack = load_stack(stack_name, root=(ctx.obj or {}).get("root")) if stack_name else None
    rep = run_rollback(_need_host(host_text), _ssh_opts(accept_new_host_key, known_hosts, identity, connect_timeout),
                       service=service, state_dir=state_dir, timeout_s=timeout_s, tunnel=tunnel, dry_run=dry_run,
                       echo=click.echo, stack=stack)
    click.echo(rep.render())


def _fleet_status(ctx: click.Context, stack_name: str, ssh: Any, hosts_csv: str | None,
                  inventory: Path | None, ledger: Path | None) -> None:
    from stackbuild.flows.fleet_status import latest_rollout, read_fleet, read_gateway, render
    from stackbuild.results.ledger import default_ledger_path
    from stackbuild.spec.load import load_stack

    stack = load_stack(stack_name, root=(ctx.obj or {}).get("root"))
    chosen = [h.strip() for h in hosts_csv.split(",")] if hosts_csv else None
    rows = read_fleet(stack, ssh, chosen, inventory)
    click.echo(render(rows, latest_rollout(ledger or default_ledger_path(_root(ctx)), stack)))
    for line in read_gateway(stack, ssh, chosen, inventory):
        click.echo(line)
    if any(r.error for r in rows):
        _exit(4)


def _validate_fully(stack: Any) -> None:
    """`validate`'s checks (rules, server flags, patches) before anything is built or touched."""
    from stackbuild.errors import SpecError
    from stackbuild.spec.check import check_stack

    findings = check_stack(stack)
    for f in findings:
        if f.severity != "error":
            click.echo(str(f), err=True)
    if errors := [f for f in findings if f.severity == "error"]:
        raise SpecError(errors)


def _need_host(host_text: str | None) -> str:
    if not host_text:
        raise InputError("--host [USER@]HOST[:PORT] is required")
    return host_text


def _exit(code: int) -> None:
    from stackbuild.cli.main import set_exit

    set_exit(code)
