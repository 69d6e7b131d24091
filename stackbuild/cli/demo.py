"""`stackbuild demo`: its options; what the demo does is flows/demo.py (run_demo)."""

from __future__ import annotations

import click

from stackbuild.cli.progress import progress_option, wants_live
from stackbuild.flows.demo import HOST_CONTAINER


@click.command("demo")
@click.option(
    "--keep-host/--remove-host",
    default=False,
    show_default=True,
    help="Leave the demo host container (and the promoted server on the sim port) running afterwards.",
)
@click.option("--registry", default="127.0.0.1:5000/stackbuild", show_default=True)
@click.option("--host-name", default=HOST_CONTAINER, show_default=True, help="Name of the local host container.")
@click.option(
    "--fleet",
    "fleet_n",
    type=click.IntRange(1, 8),
    default=None,
    help="Start N local hosts and roll the sim stack out as a fleet: baseline, a failing and a passing candidate.",
)
@progress_option
@click.pass_context
def demo_cmd(ctx: click.Context, keep_host: bool, registry: str, host_name: str, fleet_n: int | None,
             show_progress: bool | None) -> None:
    """Whole pipeline on the local sim stack and a local test host; prints the results table."""
    from stackbuild.flows.demo import run_demo

    run_demo((ctx.obj or {}).get("root"), wants_live(show_progress),
             keep_host=keep_host, registry=registry, host_name=host_name, fleet_n=fleet_n)
