"""`stackbuild status --fleet STACK`: what every host runs (read from the hosts, in parallel),
next to the last rollout the ledger recorded for the stack."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from stackbuild.errors import StackbuildError
from stackbuild.fleet.inventory import fleet_of, host_stack, select
from stackbuild.fleet.rollout import each
from stackbuild.flows.deploy_host import Endpoint, Reach, gateway_lines
from stackbuild.host import gateway
from stackbuild.host.converge import status
from stackbuild.host.reach import gateway_target
from stackbuild.host.ssh import SshOptions, parse_host
from stackbuild.host.state import HostPaths, lease_holder
from stackbuild.render.gateway import worker_url
from stackbuild.results.ledger import Ledger, RolloutRecord
from stackbuild.spec.lock.smg import hostname
from stackbuild.spec.stack import Stack


@dataclass(frozen=True)
class HostStatusRow:
    host: str
    service: str
    active: bool
    image: str | None
    release: str | None  # stack-variant of the current release
    verdict: str | None
    pending: str | None
    lock: str | None
    error: str | None = None
    enabled: str = ""  # systemd's UnitFileState of the main unit: "enabled" starts it on boot

    @property
    def digest(self) -> str | None:
        return self.image.split("@", 1)[1] if self.image and "@" in self.image else None


def read_fleet(stack: Stack, ssh: SshOptions, hosts: list[str] | None, inventory: Path | None,
               reach: Reach | None = None) -> list[HostStatusRow]:
    declared, _ = fleet_of(stack, inventory)
    chosen = select(declared, hosts, str(stack.source))
    reach = reach or Reach()

    def one(name: str) -> HostStatusRow:
        h = next(x for x in chosen if x.name == name)
        hs = host_stack(stack, h)
        paths = HostPaths(hs.host.state_dir, hs.host.service)
        r = reach.connect(parse_host(h.target), ssh)
        try:
            st = status(r, paths)
        finally:
            r.close()
        cur = st.state.current
        return HostStatusRow(
            host=name, service=paths.service, active=st.active, image=cur.image if cur else None,
            release=(f"{cur.stack}-{cur.variant}" if cur.variant else cur.stack) if cur else None,
            verdict=st.state.last_verdict,
            pending=f"{st.state.pending.op} of {st.state.pending.image}" if st.state.pending else None,
            lock=lease_holder(st.lease_owner, time.time()), enabled=st.enabled)

    got = each([h.name for h in chosen], one, 8)
    rows = []
    for name, r in got.items():
        if isinstance(r, Exception):
            rows.append(HostStatusRow(name, "-", False, None, None, None, None, None,
                                      error=(str(r) or type(r).__name__).splitlines()[0]))
        else:
            rows.append(r)
    return rows


def read_gateway(stack: Stack, ssh: SshOptions, hosts: list[str] | None, inventory: Path | None,
                 reach: Reach | None = None) -> list[str]:
    """`status --fleet`: the fleet's gateway and what it says of each worker (GET /workers), the host each is."""
    gw = stack.gateway
    if gw is None:
        return []
    declared, _ = fleet_of(stack, inventory)
    chosen = select(declared, hosts, str(stack.source))
    at = gateway_target(stack, {h.name: h.target for h in chosen}, chosen[0].target)
    names = {worker_url(h.target, port, hostname(at)): h.name for h in chosen
             for port in (host_stack(stack, h).runtime.port, host_stack(stack, h).runtime.staging_port)}
    reach = reach or Reach()
    try:
        r = reach.connect(parse_host(at), ssh)
    except StackbuildError as err:
        return [f"  gateway {gw.service} on {at}: UNREACHABLE ({str(err).splitlines()[0][:160]})"]
    try:
        rec = next((x for x in gateway.records(r, stack.host.state_dir) if x.service == gw.service), None)
        if rec is None:
            return [f"  gateway {gw.service} on {at}: not deployed yet (a deploy --fleet brings it up)"]
        return gateway_lines(reach, r, Endpoint(r, parse_host(at), None), rec, names)
    finally:
        r.close()


def latest_rollout(ledger: Path, stack: Stack) -> RolloutRecord | None:
    """The last rollout of `stack` (its variants included) the ledger holds, if it has one."""
    if not ledger.exists():
        return None
    with Ledger(ledger) as db:
        mine = [r for r in db.rollouts() if r.stack == stack.name or r.stack.startswith(stack.name + "-")]
    return mine[-1] if mine else None


def render(rows: list[HostStatusRow], last_rollout: RolloutRecord | None) -> str:
    out = ["| host | service | active | on boot | release | digest | last verdict | pending | lock |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.error:
            out.append(f"| {r.host} | - | UNREACHABLE | | | | | | {r.error[:80]} |")
            continue
        boot = "starts" if r.enabled == "enabled" else f"NOT started ({r.enabled or 'no unit'})"
        out.append(f"| {r.host} | {r.service} | {'active' if r.active else 'NOT active'} | {boot} | "
                   f"{r.release or 'none'} | {(r.digest or '')[:19]} | {r.verdict or ''} | {r.pending or ''} | "
                   f"{r.lock or ''} |")
    if last_rollout is not None:
        lr = last_rollout
        out.append(f"\nlast rollout {lr.id} of {lr.stack} ({lr.digest[:19]}): {lr.outcome}, on_failure={lr.policy}"
                   + (f": {lr.cause}" if lr.cause else ""))
        out += [f"  {h.host}: {h.outcome}" + (f" ({h.verdict})" if h.verdict else "")
                + (" FLAGGED" if h.flagged else "") for h in lr.hosts]
    return "\n".join(out)
