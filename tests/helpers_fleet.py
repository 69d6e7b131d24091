"""A fleet of scripted FakeHosts for unit tests of `stackbuild deploy --fleet` (flows.rollout.run_fleet)
and `status --fleet` (flows.fleet_status.read_fleet).

The rollout runs the real ops (flows.rollout_ops.RealOps), and through them the real single-host
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

from helpers_deploy import CANDIDATE, REPO, FakeGate, sim_stack, state, with_incumbent

from stackbuild.effects.gateway import Gateway
from stackbuild.effects.readiness import Pace, Probe
from stackbuild.errors import InfraError
from stackbuild.fleet.rollout import DeployResult, HostView
from stackbuild.flows.deploy_host import Reach, RunOptions
from stackbuild.flows.rollout import FleetArgs, run_fleet
from stackbuild.flows.rollout_ops import RealOps
from stackbuild.host.request import GateFn
from stackbuild.host.ssh import HostAddress, Remote, SshOptions
from stackbuild.host.state import HostState
from stackbuild.render.gateway import KEY_VAR, key_file, pool_file, pool_urls
from stackbuild.results.display import Sink
from stackbuild.spec.fleet import Fleet, FleetHost
from stackbuild.spec.gateway import Gateway as GatewaySpec
from stackbuild.spec.stack import Stack
from stackbuild.testing.fake_gateway import FakeGateway
from stackbuild.testing.fake_host import SERVES, Client, FakeHost
from stackbuild.testing.fake_systemd import env_values

GW_IMAGE = f"{REPO}@sha256:" + "9" * 64  # the gateway's image, as if built and pushed
_GATEWAY = sim_stack().gateway
assert _GATEWAY is not None
GATEWAY_SPEC: GatewaySpec = _GATEWAY


def fleet_stack(strategy: str, n: int = 3, waves: tuple[int | str, ...] = (1, 2, "100%"),
                soak_s: float = 0.0, *, gateway: bool = True) -> Stack:
    """The shipped sim stack with a fleet of `n` hosts h0.. (waves: canary h0, then h1, then the rest),
    behind its gateway (on h0) unless `gateway` is false (clients on each host's port)."""
    stack = sim_stack()
    host = stack.host.model_copy(update={
        "strategy": strategy, "channel": None, "hosts": tuple(FleetHost(name=f"h{i}") for i in range(n)),
        "fleet": Fleet(waves=waves, soak_s=soak_s, soak_interval_s=1.0)})
    return stack.model_copy(update={"host": host, **({} if gateway else {"gateway": None})})


def fake_fleet(n: int = 3) -> dict[str, FakeHost]:
    """One FakeHost per name, each with the incumbent promoted and serving, sharing one client; each
    can pull and run the gateway image (h0 runs it: the first host, the sim stack names none)."""
    hosts = {}
    client = Client()
    for i in range(n):
        h = with_incumbent()
        h.address, h.client = f"root@h{i}", client
        h.registry.add(GW_IMAGE)
        h.servers[GW_IMAGE] = SERVES
        hosts[f"h{i}"] = h
    return hosts


def fleet_gateway(fakes: dict[str, FakeHost], request_s: float = 2.0) -> FakeGateway:
    """The gateway in front of the fake fleet, its unit on h0 (h0 is 127.0.0.1 to it)."""
    return gateway_on(fakes["h0"], lambda host: fakes["h0" if host == "127.0.0.1" else host], request_s)


def gateway_on(host: FakeHost, host_of: Callable[[str], FakeHost], request_s: float = 2.0) -> FakeGateway:
    """The gateway whose unit runs on `host`, on that host's clock: it answers while its unit runs there,
    starts routing to what its pool file names, and a worker answers while the host `host_of` its URL's
    host name serves the URL's port."""
    gw = GATEWAY_SPEC

    def serves(url: str) -> bool:
        name, port = url.removeprefix("http://").rsplit(":", 1)
        return host_of(name).serving(int(port)) is not None

    started: list[FakeGateway] = []

    def up() -> bool:
        if host.serving(gw.port) is None:
            return False
        if not started:  # smg reads its key file and its pool file when it starts
            fake.key = env_values(host.files.get(key_file(gw), "")).get(KEY_VAR)  # what --env-file gives it
            started.append(fake.start(*pool_urls(host.files.get(pool_file(gw)))))
        return True

    fake = FakeGateway(host.pace(0.2), url=f"http://127.0.0.1:{gw.port}", request_s=request_s, serves=serves, up=up)
    return fake


def sending(gw: FakeGateway) -> Callable[[str, list[str]], bool]:
    """A client of the gateway sending one request on every command any host is sent (Client.die_before)."""
    def send(_address: str, _argv: list[str]) -> bool:
        gw.send()
        return False
    return send


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


class FakeConn:
    """One connection to a fake host: the host's own commands, closed on its own, so connections that
    threads hold at once to one host (the gateway's, say) do not close each other."""

    def __init__(self, host: FakeHost, on_close: Callable[[], None]) -> None:
        self.host, self._on_close, self._closed = host, on_close, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.host, name)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._on_close()


@dataclass
class FakeReach(Reach):
    """The fake hosts by name: connecting to one hands out the host itself (a fresh connection to
    it), its servers answer HTTP, its clock paces the pollers and the soak. `down`: names whose
    sshd does not answer."""

    fakes: dict[str, FakeHost]
    gates: dict[str, Callable[..., Any]] = field(default_factory=dict)  # name -> its gate (default: FakeGate)
    down: set[str] = field(default_factory=set)
    gw: FakeGateway | None = None  # the gateway in front of them (default: fleet_gateway)

    def __post_init__(self) -> None:
        if self.gw is None and "h0" in self.fakes:
            self.gw = fleet_gateway(self.fakes)

    _open: dict[str, int] = field(default_factory=dict)  # connections open to each host

    def _fake(self, remote: Remote) -> tuple[str, FakeHost]:
        host = remote.host if isinstance(remote, FakeConn) else remote
        return next((n, f) for n, f in self.fakes.items() if f is host)

    def connect(self, address: HostAddress, opts: SshOptions) -> Remote:
        if address.host in self.down or address.host not in self.fakes:
            raise InfraError(f"cannot connect to {address} over SSH: Connection refused")
        name = address.host
        self._open[name] = self._open.get(name, 0) + 1
        self.fakes[name].reconnect()
        return FakeConn(self.fakes[name], lambda: self._closed(name))

    def _closed(self, name: str) -> None:
        self._open[name] -= 1
        if not self._open[name]:  # the last one open: the host's connection goes (what tests look at)
            self.fakes[name].close()

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

    def gateway_api(self, remote: Remote, url: str, key: str | None) -> Gateway:
        assert self.gw is not None and url == self.gw.url, f"no fake gateway at {url}"
        return self.gw.client(key)

    def in_flight(self, remote: Remote, base_url: str, worker: str) -> float | None:
        assert self.gw is not None
        return self.gw.in_flight_of(worker)


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
               gates: dict[str, Callable[..., Any]] | None = None, gw: FakeGateway | None = None) -> FleetArgs:
    """The command's options: the candidate by digest, the ledger under `tmp`, the fake hosts' reach
    (their servers are reached directly: no tunnel), the gateway's image already built."""
    return FleetArgs(stack=stack, ssh=SshOptions(), image=CANDIDATE, ledger=tmp / "ledger.db", root=tmp,
                     tunnel=False, reach=FakeReach(fakes, dict(gates or {}), gw=gw), gateway_image=GW_IMAGE)


def rollout(fakes: dict[str, FakeHost], stack: Stack, tmp: Path, gates: dict[str, Callable[..., Any]] | None = None,
            *, die_before: Kill | None = None, die_after: Kill | None = None, gw: FakeGateway | None = None
            ) -> FleetRun:
    """Run the fleet command once: a new process (one client for every host), killed where
    `die_before`/`die_after` say (fake_base.Client), which raises Killed out of this call. `gw`:
    the gateway in front of the fleet (default: a new one, as when the gateway restarted)."""
    client = Client(die_before=die_before, die_after=die_after)
    for f in fakes.values():
        f.client = client
    run = FleetRun([], [])

    def make_ops(opts: RunOptions, hosts: dict[str, FleetHost], image: str, sink: Sink) -> TracedOps:
        ops = TracedOps(run=opts, hosts=hosts, image=image, sink=sink)
        run.ops.append(ops)
        return ops

    try:
        run.code = run_fleet(fleet_args(fakes, stack, tmp, gates, gw), echo=run.out.append, make_ops=make_ops)
    finally:
        _open(fakes)
    return run
