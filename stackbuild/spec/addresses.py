"""Every server a stack places has its own host, service and ports (pure).

A side-by-side candidate runs on `staging_port` while the incumbent serves `port`: were they the same,
the candidate would die with "address already in use" while every probe reached the incumbent (issue
#29). Two inventory entries that name one machine (the same address, the user aside) would likewise
share ports, or, with the same service, deploy one service twice at once. These are refused as spec
errors, `file:line:col`, before any host is touched: by `validate`, and by `deploy --fleet` first.
(`runtime.port == runtime.staging_port` in the stack itself is refused by its model: spec/stack.py.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stackbuild.errors import Finding
from stackbuild.spec.fleet import FleetHost
from stackbuild.spec.kinds import SSH_TARGET
from stackbuild.spec.yamlpos import Pos

_RULE = "addresses"


def _machine(target: str) -> str:
    """The machine an SSH target reaches: its host (lower case) and SSH port, the user aside."""
    m = SSH_TARGET.match(target)
    if m is None:
        return target.lower()
    return f"{(m['v6'] or m['host']).lower()}:{m['port'] or 22}"


@dataclass(frozen=True)
class Placed:
    """One host entry as it deploys: its name, machine, service and the two ports it binds."""

    index: int
    name: str
    target: str
    service: str
    port: int
    staging_port: int


def placed(hosts: Sequence[FleetHost], service: str, port: int, staging_port: int) -> list[Placed]:
    """Each entry with the stack's values where it overrides none."""
    return [Placed(i, h.name, h.target, h.service or service, h.port or port, h.staging_port or staging_port)
            for i, h in enumerate(hosts)]


def clash_findings(hosts: Sequence[Placed], pos: Callable[[int, str], Pos], where: str) -> list[Finding]:
    """One error per entry that clashes with itself or an earlier one; `pos(i, key)` says where entry i's
    `key` is written, `where` how the list is named in messages (e.g. `host.hosts`)."""
    out: list[Finding] = []

    def err(i: int, key: str, msg: str) -> None:
        p = pos(i, key)
        out.append(Finding(p.file, p.line, p.col, "error", f"{where}.{i}: {msg}", _RULE))

    for h in hosts:
        if h.port == h.staging_port:
            err(h.index, "staging_port", f"host {h.name}: staging_port {h.staging_port} is its port too; the "
                "candidate must bind a port the incumbent does not hold: give it another staging_port")
            continue
        for e in hosts[: h.index]:
            if _machine(e.target) != _machine(h.target):
                continue
            if e.service == h.service:
                err(h.index, "name", f"host {h.name} is {e.name} again (address {_machine(h.target)}, service "
                    f"{h.service}): a host takes one place in a rollout; remove one, or give it its own service")
                break
            shared = sorted({e.port, e.staging_port} & {h.port, h.staging_port})
            if shared:
                err(h.index, "port", f"host {h.name} shares port(s) {', '.join(map(str, shared))} with {e.name} "
                    f"on the same address {_machine(h.target)}: give each service its own port and staging_port")
                break
    return out
