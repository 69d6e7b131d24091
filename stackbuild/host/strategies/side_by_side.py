"""side-by-side: the candidate runs in the service's other unit, on that unit's port, while the
incumbent keeps serving; once it passed its gate, one oneshot unit on the host switches the main
unit to it (stop, install, start: an outage for as long as the new container takes to listen).

What a spec's side-by-side becomes once the candidate is placed (`runs_as`): a first deploy has
nothing to run beside (swap, on the main unit); a candidate behind a gateway, or one already on the
main unit, keeps its own unit (take-over); only the rest switches, so here there is no gateway.
"""

from __future__ import annotations

from stackbuild.host import secrets, units
from stackbuild.host.deploy_steps import Placement, readiness
from stackbuild.host.pool import GatewayLink
from stackbuild.host.strategy import Candidate, Served

NAME = "side-by-side"
IN_PLACE = False


def runs_as(p: Placement, gateway: GatewayLink | None) -> str:
    if not p.beside:
        return "swap"
    if gateway is not None or p.slot == "main":
        return "take-over"
    return NAME


def plan_start(c: Candidate) -> None:
    return None


def start(c: Candidate) -> str:
    """Nothing to make room for: the other unit's port is free (preflight) and no gateway routes to it."""
    return ""


def hand_over(c: Candidate) -> Served | None:
    """The switch, then the main unit's readiness on runtime.port (a failure rolls back)."""
    remote, paths, stack, conv = c.remote, c.paths, c.req.stack, c.conv
    with c.rep.step("switch") as st:
        port, ran_from = stack.runtime.port, paths.override_path
        text = c.svc.render_unit(stack, image=c.req.image, port=port, name=paths.service)
        staged = units.stage_and_verify(remote, paths.staging_dir, paths.main_unit, text)
        if stack.runtime.secrets:
            secrets.stage(remote, paths, stack.runtime.secrets, c.req.secrets, target=secrets.env_file(paths.service))
        if c.incumbent_active:
            conv.outage_begin()
        args = [paths.candidate_unit, paths.runs_from("staging", serving=False), paths.main_unit, staged, ran_from]
        units.switch(remote, paths, args)
        st.detail = f"{paths.main_unit} now runs the candidate on {port}"
    ready = readiness(remote, c.svc, paths.main_unit, port, stack, c.rep)
    if not ready.ok:
        c.roll_back(f"candidate passed the gate but failed after the switch: {ready.detail}", verdict="not-ready")
        return None
    conv.outage_end()
    return Served("main", port, ran_from, staged, text, rejoin=False)


def plan_hand_over(c: Candidate) -> None:
    c.svc.echo(f"would switch {c.paths.main_unit} to the candidate on port {c.req.stack.runtime.port} "
               "(an outage: stop, then start; a gateway: section makes it none)")
