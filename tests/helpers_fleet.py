"""A fleet of scripted FakeHosts for unit tests of `stackbuild deploy --fleet` (fleet.session.run_fleet).

`FakeFleetOps` is the rollout's FleetOps over FakeHosts: each step is the code the real
ops run on a host's connection (converge.settle, ops.preflight_on, ops.view_on, the deploy
flow, ops.sample_on, converge.rollback), on that host's clock; only the connection and the
gate (helpers_deploy.FakeGate, or one given per host) are stand-ins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers_deploy import CANDIDATE, FakeGate, request, services, sim_stack, with_incumbent

from stackbuild.fleet.inventory import host_stack
from stackbuild.fleet.ops import LOCK_TTL_S, paths_of, preflight_on, result_of, sample_on, view_on
from stackbuild.fleet.rollout import DeployResult, HostView
from stackbuild.fleet.session import FleetArgs, run_fleet
from stackbuild.fleet.soak import soak
from stackbuild.host import converge, units
from stackbuild.host.deploy import deploy
from stackbuild.host.fake import Client, FakeHost
from stackbuild.host.outcome import DeployReport
from stackbuild.host.session import RunOptions
from stackbuild.host.ssh import SshOptions
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


@dataclass
class FakeFleetOps:
    fakes: dict[str, FakeHost]
    run: RunOptions
    hosts: dict[str, FleetHost]
    image: str
    gates: dict[str, Callable[..., Any]] = field(default_factory=dict)  # host -> its gate (default: pass)
    calls: list[tuple[str, str]] = field(default_factory=list)

    def stack_of(self, host: str) -> Stack:
        return host_stack(self.run.stack, self.hosts[host])

    def _conv(self, host: str, what: str) -> converge.Converger:
        f, hs = self.fakes[host], self.stack_of(host)
        rep = DeployReport(host=host, service=hs.host.service, stack=hs.label, image="-", strategy=what)
        return converge.converger_for(hs, f.endpoint, rep, 1800.0, http_probe=f.http_probe, pace=f.pace(0.5))

    def converge(self, host: str) -> str | None:
        self.calls.append(("converge", host))
        converge.settle(self.fakes[host], paths_of(self.stack_of(host)), self._conv(host, "converge"), LOCK_TTL_S)
        return None

    def preflight(self, host: str) -> str | None:
        self.calls.append(("preflight", host))
        return preflight_on(self.fakes[host], self.stack_of(host), self.image)

    def view(self, host: str) -> HostView:
        return view_on(self.fakes[host], self.stack_of(host), self.image)

    def pull(self, host: str) -> str | None:
        units.ensure_image(self.fakes[host], self.image, 1800.0)
        return None

    def deploy(self, host: str) -> DeployResult:
        self.calls.append(("deploy", host))
        f, hs = self.fakes[host], self.stack_of(host)
        rep = deploy(f, request(hs.host.strategy, self.image, stack=hs),
                     services(f, self.gates.get(host) or FakeGate(f)))  # type: ignore[arg-type]
        return result_of(rep, rep.exit_code)

    def soak(self, host: str, seconds: float, interval_s: float) -> str | None:
        self.calls.append(("soak", host))
        f, hs = self.fakes[host], self.stack_of(host)
        probe = f.http_probe(f"http://127.0.0.1:{hs.runtime.port}")

        def sample() -> Any:
            return sample_on(f, f"{hs.host.service}.service", 200 if probe.health()[0] else None, probe, {})

        res = soak(sample, seconds, interval_s, clock=f.clock, sleep=f.sleep)
        return None if res.ok else res.detail

    def revert(self, host: str) -> str | None:
        self.calls.append(("revert", host))
        converge.rollback(self.fakes[host], paths_of(self.stack_of(host)), self._conv(host, "rollback"), LOCK_TTL_S)
        return None

    def host_class(self, host: str) -> str:
        return "no GPU"


@dataclass
class FleetRun:
    """One `stackbuild deploy --fleet` process against the fake fleet: its output, ops and exit code."""

    out: list[str]
    ops: list[FakeFleetOps]
    code: int | None = None


Kill = Callable[[str, list[str]], bool]


def rollout(fakes: dict[str, FakeHost], stack: Stack, tmp: Path, gates: dict[str, Callable[..., Any]] | None = None,
            *, die_before: Kill | None = None, die_after: Kill | None = None) -> FleetRun:
    """Run the fleet command once: a new process (one client for every host), killed where
    `die_before`/`die_after` say (fake_base.Client), which raises Killed out of this call."""
    client = Client(die_before=die_before, die_after=die_after)
    for f in fakes.values():
        f.client = client
    run = FleetRun([], [])

    def make_ops(opts: RunOptions, hosts: dict[str, FleetHost], image: str, echo: Callable[[str], None]
                 ) -> FakeFleetOps:
        ops = FakeFleetOps(fakes, opts, hosts, image, dict(gates or {}))
        run.ops.append(ops)
        return ops

    args = FleetArgs(stack=stack, ssh=SshOptions(), image=CANDIDATE, ledger=tmp / "ledger.db", root=tmp)
    run.code = run_fleet(args, echo=run.out.append, make_ops=make_ops)  # type: ignore[arg-type]
    return run
