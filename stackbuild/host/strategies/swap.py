"""swap: the candidate runs in the incumbent's own unit, on its port. The incumbent leaves the gateway
and stops first (an outage, announced before it begins by the "outage plan" step); promoted, the
server goes back into the gateway."""

from __future__ import annotations

from stackbuild.host import units
from stackbuild.host.deploy_steps import Placement
from stackbuild.host.pool import GatewayLink
from stackbuild.host.strategy import Candidate, Served

NAME = "swap"
IN_PLACE = True


def runs_as(p: Placement, gateway: GatewayLink | None) -> str:
    return NAME


def plan_start(c: Candidate) -> None:
    gw, echo, p = c.svc.gateway, c.svc.echo, c.p
    if units.is_active(c.remote, c.paths.unit_of(p.serving)):
        if gw is not None:
            echo(f"would drain {gw.worker_url(p.serving_port)} out of the gateway {gw.url}")
        echo(f"would stop the incumbent {c.paths.unit_of(p.serving)}")
        if c.svc.outage_plan is not None:
            echo(c.svc.outage_plan())


def start(c: Candidate) -> str:
    """The incumbent out of the gateway (its in-flight requests end on it; no new ones come) and stopped."""
    if not c.incumbent_active:
        return ""
    gw, detail = c.svc.gateway, ""
    if gw is not None:
        detail = gw.leave_or_back(c.p.serving_port) + "; "
    c.conv.outage_begin()
    units.stop(c.remote, c.unit)
    return detail


def hand_over(c: Candidate) -> Served:
    """It serves already, where the incumbent did."""
    p = c.p
    return Served(p.slot, p.port, c.paths.runs_from(p.slot, serving=True), f"{c.paths.staging_dir}/{c.unit}",
                  c.text, rejoin=True)


def plan_hand_over(c: Candidate) -> None:
    return None
