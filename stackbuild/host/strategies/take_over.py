"""take-over: a side-by-side candidate stays where it runs. Behind the gateway it joins the pool and
the incumbent leaves it and stops; without one it already runs on the main unit's port (the release
was on the staging unit) and the incumbent just stops. Nothing restarts; no request fails."""

from __future__ import annotations

from stackbuild.host import secrets, units
from stackbuild.host.deploy_steps import Placement
from stackbuild.host.pool import GatewayLink
from stackbuild.host.strategy import Candidate, Served

NAME = "take-over"
IN_PLACE = False


def runs_as(p: Placement, gateway: GatewayLink | None) -> str:
    return NAME


def plan_start(c: Candidate) -> None:
    return None


def start(c: Candidate) -> str:
    """A stale entry for the candidate's port (a killed run's) never routes to it."""
    return "" if c.svc.gateway is None else not_pooled(c.svc.gateway, c.p.port)


def not_pooled(gw: GatewayLink, port: int) -> str:
    """The candidate's port out of the gateway and its pool file before the candidate starts there: an
    earlier run killed while its candidate took over left that URL in, and the gateway would route
    users to the new, ungated process as soon as it answers. A no-op when it is not there."""
    d = gw.leave(port)
    return "" if d.detail.startswith("not in the gateway") else f"stale {d.url} out of the gateway ({d.detail}); "


def hand_over(c: Candidate) -> Served:
    """The incumbent stops once it is out of the pool; the candidate's unit is staged again without the
    candidate's own env file, and the operator's file gets the secrets."""
    remote, paths, p, gw, stack = c.remote, c.paths, c.p, c.svc.gateway, c.req.stack
    with c.rep.step("take over") as st:
        said = [gw.join(p.port)] if gw is not None else []
        if c.incumbent_active:
            if gw is not None:
                said.append(gw.leave_or_back(p.serving_port))
            units.stop(remote, paths.unit_of(p.serving))
            said.append(f"stopped {paths.unit_of(p.serving)}")
        text = c.svc.render_unit(stack, image=c.req.image, port=p.port, name=c.unit.removesuffix(".service"))
        staged = units.stage_and_verify(remote, paths.staging_dir, c.unit, text)
        if stack.runtime.secrets:
            secrets.stage(remote, paths, stack.runtime.secrets, c.req.secrets, target=secrets.env_file(paths.service))
        st.detail = "; ".join([*said, f"{c.unit} serves port {p.port}: nothing restarted"])
    return Served(p.slot, p.port, paths.runs_from(p.slot, serving=False), staged, text, rejoin=False)


def plan_hand_over(c: Candidate) -> None:
    gw, p = c.svc.gateway, c.p
    if gw is not None:
        c.svc.echo(f"would add {gw.worker_url(p.port)} to the gateway {gw.url}, drain "
                   f"{gw.worker_url(p.serving_port)} and stop {c.paths.unit_of(p.serving)}: nothing restarts, "
                   f"port {p.port} serves from then on")
