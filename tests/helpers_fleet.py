"""A fleet of scripted FakeHosts for unit tests of `stackbuild deploy --fleet` (fleet.session.run_fleet)
and `status --fleet` (fleet.status.read_fleet).

The rollout runs the real ops (fleet.ops.RealOps), and through them the real single-host
code (converge.settle, preflight, run_deploy and the deploy flow, the soak's samples,
converge.rollback), on each host's clock. Only how a host is reached is a stand-in: `FakeReach`
hands out the fake host as the connection, its servers as the HTTP side, and the gate
(helpers_deploy.FakeGate, or one given per host).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers_deploy import CANDIDATE, FakeGate, sim_stack, state, with_incumbent

from stackbuild.effects.readiness import Pace, Probe
from stackbuild.errors import InfraError
from stackbuild.fleet.ops import RealOps
from stackbuild.fleet.rollout import DeployResult, HostView
from stackbuild.fleet.session import FleetArgs, run_fleet
from stackbuild.host.fake import Client, FakeHost
from stackbuild.host.request import GateFn
from stackbuild.host.session import Reach, RunOptions
from stackbuild.host.ssh import HostAddress, Remote, SshOptions
from stackbuild.host.state import HostState
from stackbuild.results.display import Sink
from stackbuild.spec.fleet import Fleet, FleetHost
from stackbuild.spec.stack import Stack


def fleet_stack(strategy: str, n: int = 3, waves: tuple[int | str, ...] = (1, 2, "100%"),
                soak_s: float = 0.0) -> Stack:
    """The shipped sim stack with a fleet of `n` hosts h0.. (waves: canary h0, then h1, then the rest)."""
    stack = sim_stack()
    host = stack.host.model_copy(update={
        "strategy": strategy, "channel": None, "hosts": tuple(FleetHost(name=f"h{i}") for i in range(n)),
        "fleet": Fleet(waves=waves, soak_s=soak_s, soak_interval_s=1.0)})
    return stack.model_copy(update={"host": host})


def fake_fleet(n: int = 3) -> dict[str, FakeHost]:
    """One FakeHost per name, each with the incumbent promoted and serving, sharing one client."""
    hosts = {}
    client = Client()
    for i in range(n):
        h = with_incumbent()
        h.address, h.client = f"root@h{i}", client
        hosts[f"h{i}"] = h
    return hosts


def revive(fakes: dict[str, FakeHost]) -> None:
    """After a kill: a live client to look at the hosts with (tests read them through commands)."""
    client = Client()
    for f in fakes.values():
        f.client = client


def _open(fakes: dict[str, FakeHost]) -> None:
    """The test's own connection to each host (the rollout closed its own), to read them with."""
    for f in fakes.values():
        f.closed = False


def look(f: FakeHost) -> HostState:
    """The host's state file, read over the test's own connection (an op closed its own)."""
    _open({"": f})
    return state(f)


@dataclass
class FakeReach(Reach):
    """The fake hosts by name: connecting to one hands out the host itself (a fresh connection to
    it), its servers answer HTTP, its clock paces the pollers and the soak. `down`: names whose
    sshd does not answer."""

    fakes: dict[str, FakeHost]
    gates: dict[str, Callable[..., Any]] = field(default_factory=dict)  # name -> its gate (default: FakeGate)
    down: set[str] = field(default_factory=set)

    def _fake(self, remote: Remote) -> tuple[str, FakeHost]:
        return next((n, f) for n, f in self.fakes.items() if f is remote)

    def connect(self, address: HostAddress, opts: SshOptions) -> Remote:
        if address.host in self.down or address.host not in self.fakes:
            raise InfraError(f"cannot connect to {address} over SSH: Connection refused")
        return self.fakes[address.host].reconnect()

    def http_probe(self, remote: Remote) -> Callable[[str], Probe]:
        return self._fake(remote)[1].http_probe

    def pace(self, remote: Remote) -> Pace:
        return self._fake(remote)[1].pace(0.5)

    def gate(self, remote: Remote, access: str) -> GateFn:
        name, f = self._fake(remote)
        return self.gates.get(name) or FakeGate(f)

    def watch(self, remote: Remote, url: str) -> tuple[int | None, str]:
        healthy, _ = self._fake(remote)[1].http_probe(url).health()
        return (200 if healthy else 503), ""


@dataclass
class TracedOps(RealOps):
    """The real ops, with the order they were called in (`calls`: (step, host))."""

    calls: list[tuple[str, str]] = field(default_factory=list)

    def converge(self, host: str) -> str | None:
        self.calls.append(("converge", host))
        return super().converge(host)

    def preflight(self, host: str) -> str | None:
        self.calls.append(("preflight", host))
        return super().preflight(host)

    def view(self, host: str) -> HostView:
        self.calls.append(("view", host))
        return super().view(host)

    def deploy(self, host: str) -> DeployResult:
        self.calls.append(("deploy", host))
        return super().deploy(host)

    def soak(self, host: str, seconds: float, interval_s: float) -> str | None:
        self.calls.append(("soak", host))
        return super().soak(host, seconds, interval_s)

    def revert(self, host: str) -> str | None:
        self.calls.append(("revert", host))
        return super().revert(host)


@dataclass
class FleetRun:
    """One `stackbuild deploy --fleet` process against the fake fleet: its output, ops and exit code."""

    out: list[str]
    ops: list[TracedOps]
    code: int | None = None


Kill = Callable[[str, list[str]], bool]


def fleet_args(fakes: dict[str, FakeHost], stack: Stack, tmp: Path,
               gates: dict[str, Callable[..., Any]] | None = None) -> FleetArgs:
    """The command's options: the candidate by digest, the ledger under `tmp`, the fake hosts' reach
    (their servers are reached directly: no tunnel)."""
    return FleetArgs(stack=stack, ssh=SshOptions(), image=CANDIDATE, ledger=tmp / "ledger.db", root=tmp,
                     tunnel=False, reach=FakeReach(fakes, dict(gates or {})))


def rollout(fakes: dict[str, FakeHost], stack: Stack, tmp: Path, gates: dict[str, Callable[..., Any]] | None = None,
            *, die_before: Kill | None = None, die_after: Kill | None = None) -> FleetRun:
    """Run the fleet command once: a new process (one client for every host), killed where
    `die_before`/`die_after` say (fake_base.Client), which raises Killed out of this call."""
    client = Client(die_before=die_before, die_after=die_after)
    for f in fakes.values():
        f.client = client
    run = FleetRun([], [])

    def make_ops(opts: RunOptions, hosts: dict[str, FleetHost], image: str, sink: Sink) -> TracedOps:
        ops = TracedOps(run=opts, hosts=hosts, image=image, sink=sink)
        run.ops.append(ops)
        return ops

    try:
        run.code = run_fleet(fleet_args(fakes, stack, tmp, gates), echo=run.out.append, make_ops=make_ops)
    finally:
        _open(fakes)
    return run
