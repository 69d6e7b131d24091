"""How this process reaches a host (`Reach`), the server on it (`Endpoint`), and the gateway in front of
it (`gateway_link`). The glue (flows/deploy_host.py, flows/rollout_ops.py) goes through these; unit tests pass a
`Reach` over the scripted fake hosts and a fake gateway (tests/helpers_fleet.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from stackbuild.effects import http
from stackbuild.effects.gateway import Gateway, HttpGateway, worker_in_flight
from stackbuild.effects.readiness import HttpProbe, Pace, Probe
from stackbuild.gate.result import GateResult
from stackbuild.gate.runner import run_gate
from stackbuild.host.dryrun import DryRunRemote
from stackbuild.host.gateway import control_key, edit_pool, ensure, read_pool
from stackbuild.host.pool import GatewayLink
from stackbuild.host.request import GateFn, LiveIncumbent
from stackbuild.host.ssh import HostAddress, Remote, SshOptions, connect, parse_host
from stackbuild.render.gateway import pool_urls, worker_url
from stackbuild.spec.lock.smg import hostname
from stackbuild.spec.profile import GateProfile
from stackbuild.spec.stack import Stack


class Reach:
    """How this process reaches a host and the server on it: an SSH connection, and over HTTP the
    server's readiness layers, the pace to poll them at, the gate, what a soak watches, the
    gateway's API and a server's in-flight count.

    Unit tests pass a subclass over the scripted fake hosts (tests/helpers_fleet.py), so the
    code that drives hosts (a deploy, a rollout's ops, fleet status, rollback) runs unchanged.
    """

    def connect(self, address: HostAddress, opts: SshOptions) -> Remote:
        return connect(address, opts)

    def http_probe(self, remote: Remote) -> Callable[[str], Probe]:
        return HttpProbe

    def pace(self, remote: Remote) -> Pace:
        return Pace()

    def gate(self, remote: Remote, access: str) -> GateFn:
        def gate(url: str, profile: GateProfile, name: str, baseline: GateResult | LiveIncumbent | None,
                 ) -> GateResult:
            if isinstance(baseline, LiveIncumbent):
                return run_gate(url, profile, name=name, baseline_url=baseline.url, host_facts={"access": access})
            return run_gate(url, profile, name=name, baseline=baseline, host_facts={"access": access})

        return gate

    def watch(self, remote: Remote, url: str) -> tuple[int | None, str]:
        """GET /health_generate's status (None: no answer) and /metrics' text ("": not served).

        sglang answers /health_generate by running a one-token generation through its scheduler;
        /metrics needs --enable-metrics, and without it a soak watches the rest."""
        status_code = http.status(f"{url}/health_generate", timeout=20.0)
        try:
            reply = http.get(f"{url}/metrics", timeout=10.0)
        except http.HttpFailure:
            return status_code, ""
        return status_code, reply.body.decode(errors="replace") if reply.status == 200 else ""

    def gateway_api(self, remote: Remote, url: str, key: str | None) -> Gateway:
        """The gateway's worker API at `url` (reaching its port on the host `remote` is connected to), called
        with the control-plane key `key` (host/gateway.control_key)."""
        return HttpGateway(url, key=key)

    def in_flight(self, remote: Remote, base_url: str, worker: str) -> float | None:
        """What the server at `base_url` (as this process reaches it; `worker`: as the gateway does) has in flight."""
        return worker_in_flight(base_url)


@dataclass
class Endpoint:
    remote: Any
    address: HostAddress
    tunnel: bool | None

    @property
    def mode(self) -> str:
        use = (not self.address.is_loopback) if self.tunnel is None else self.tunnel
        return "tunnel" if use else "direct"

    def __call__(self, port: int) -> Any:
        @contextmanager
        def cm() -> Any:
            if self.mode == "direct" or getattr(self.remote, "dry_run", False):
                host = self.address.host if self.address.is_loopback else "127.0.0.1"
                yield f"http://{host}:{port}"
                return
            with self.remote.forward(port) as local_port:
                yield f"http://127.0.0.1:{local_port}"

        return cm()


def gateway_target(stack: Stack, hosts: Mapping[str, str], default: str) -> str:
    """Where the gateway runs, as an SSH target: gateway.host (a fleet host's name, or an address),
    else host.address, else `default` (the deploy's host; a rollout's first host)."""
    gw = stack.gateway
    if gw is not None and gw.host:
        return hosts.get(gw.host, gw.host)
    return stack.host.address or default


def same_host(a: str, b: str) -> bool:
    return str(parse_host(a)) == str(parse_host(b))


@contextmanager
def gateway_link(reach: Reach, ssh: SshOptions, tunnel: bool | None, stack: Stack, *, gateway_at: str,
                 server_at: str, server: Remote, endpoint: Callable[[int], Any], image: str | None = None,
                 pull_timeout_s: float = 1800.0, kept_out: bool = False,
                 prune: bool = False) -> Iterator[GatewayLink | None]:
    """The gateway in front of the server host `server_at` (connected: `server`, its ports at `endpoint`),
    for as long as the block runs; None when the stack has no gateway. The gateway's own host is
    reached over the server's connection when it is the same host, else over one of its own.
    `image`: the gateway image its unit runs (None: the unit is left as it is). `kept_out`: the caller
    drained the server host (GatewayLink.kept_out). `prune`: workers stackbuild did not put in the gateway
    are removed when it is brought up (GatewayLink.strangers)."""
    gw = stack.gateway
    if gw is None:
        yield None
        return
    same = same_host(gateway_at, server_at)
    gw_remote: Remote = server if same else reach.connect(parse_host(gateway_at), ssh)
    if getattr(server, "dry_run", False) and not same:
        gw_remote = DryRunRemote(gateway_at, reader=gw_remote, echo=getattr(server, "echo", print))
    try:
        gw_endpoint = endpoint if same else Endpoint(gw_remote, parse_host(gateway_at), tunnel)
        # made on the gateway's host before anything talks to it (a dry run only reads one that is there)
        key = control_key(gw_remote, gw.service, create=not getattr(gw_remote, "dry_run", False))
        with gw_endpoint(gw.port) as gw_url:
            api = reach.gateway_api(gw_remote, gw_url, key)
            at = hostname(gateway_at)

            def worker(port: int) -> str:
                return worker_url(server_at, port, at)

            @contextmanager
            def watch(port: int) -> Iterator[Callable[[], float | None]]:
                with endpoint(port) as base:
                    yield lambda: reach.in_flight(server, base, worker(port))

            def pool(add: list[str], remove: list[str]) -> None:
                edit_pool(gw_remote, gw, add, remove)

            def pooled() -> list[str]:
                return pool_urls(read_pool(gw_remote, gw))

            def unit(workers: list[str]) -> str:
                assert image is not None
                return ensure(gw_remote, stack, image, workers, pull_timeout_s=pull_timeout_s)

            yield GatewayLink(api, worker, watch, pool, {"main": stack.runtime.port,
                                                         "staging": stack.runtime.staging_port},
                              drain_timeout_s=gw.drain_timeout_s, join_timeout_s=stack.runtime.ready_timeout_s,
                              unit=unit if image else None, kept_out=kept_out, read_pool=pooled, prune=prune)
    finally:
        if not same:
            gw_remote.close()
