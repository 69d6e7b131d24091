"""The real `FleetOps`: each call opens its own connection to one host (through the rollout's
`Reach`) and goes through the single-host code (converge.settle, preflight, ensure_image,
run_deploy, converge.rollback). What a step does on a host's connection is a function of that
connection (`*_on`).

Hosts run in parallel threads, so nothing here is shared between calls except
read-only settings and the output lock. The unit tests run this very class on the
scripted fake hosts (tests/helpers_fleet.py passes a `Reach` over them).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Concatenate, ParamSpec

from stackbuild.effects.readiness import Probe
from stackbuild.errors import EXIT_INFRA, StackbuildError
from stackbuild.fleet.inventory import host_stack
from stackbuild.fleet.plan import host_class, spread
from stackbuild.fleet.rollout import DeployResult, HostView, each
from stackbuild.fleet.soak import Sample, SoakResult, parse_counters, soak
from stackbuild.flows.deploy_host import Endpoint, RunOptions, deploy_args, run_deploy
from stackbuild.gate.result import GateResult
from stackbuild.host import converge, units
from stackbuild.host.deploy_steps import deploy_ports, place, slot_port
from stackbuild.host.gateway import wait_answering
from stackbuild.host.outcome import DeployReport
from stackbuild.host.pool import GatewayLink
from stackbuild.host.preflight import run_preflight
from stackbuild.host.reach import gateway_link, gateway_target, same_host
from stackbuild.host.ssh import Remote, parse_host
from stackbuild.host.state import HostPaths, read_state
from stackbuild.host.strategy import strategy_named
from stackbuild.host.unit_probe import unit_state
from stackbuild.render.gateway import worker_url
from stackbuild.render.stack import render_unit
from stackbuild.results.display import Event, Log, Note, Sink, Step, bind
from stackbuild.spec.fleet import FleetHost
from stackbuild.spec.lock.smg import hostname
from stackbuild.spec.stack import Stack


def paths_of(hs: Stack) -> HostPaths:
    return HostPaths(hs.host.state_dir, hs.host.service)


def preflight_on(r: Remote, hs: Stack, image: str) -> str | None:
    """The single deploy's preflight, with the same ports (ours may be held by our own incumbent)."""
    paths = paths_of(hs)
    state = read_state(r, paths)
    active = state.current is not None and units.is_active(r, paths.unit_of(state.slot))
    p = place(hs, state, in_place=strategy_named(hs.host.strategy).IN_PLACE)
    pf = run_preflight(r, hs, image=image, ports=deploy_ports(p, active))
    return None if pf.ok else "; ".join(f"{c.name}: {c.detail}" for c in pf.failures)


def view_on(r: Remote, hs: Stack, image: str) -> HostView:
    paths = paths_of(hs)
    st = converge.status(r, paths)
    cur = st.state.current
    slot = st.state.slot  # the candidate, committed where it ran (a side-by-side through the gateway: either unit)
    want = render_unit(hs, image=image, port=slot_port(hs, slot), name=paths.unit_of(slot).removesuffix(".service"))
    return HostView(
        on_candidate=bool(cur and cur.image == image and cur.unit == want and st.active),
        image=cur.image if cur else None,
        verdict=st.state.last_verdict,
        pending=st.state.pending is not None,
        lock=st.lease_owner or None,
        active=st.active,
        since=cur.at if cur else None,
    )


def result_of(rep: DeployReport, code: int) -> DeployResult:
    """A host's deploy as the rollout judges it: outcome, verdict, and the candidate's tok/s per level."""
    medians: dict[int, float] = {}
    noise: dict[int, float] = {}
    if rep.gate_json:
        g = GateResult.model_validate_json(rep.gate_json)
        medians = {lv.concurrency: lv.median_output_tok_s for lv in g.levels}
        noise = {lv.concurrency: spread([r.output_tok_s for r in lv.runs]) for lv in g.levels}
    return DeployResult(rep.outcome, code, rep.verdict, rep.cause, medians, noise)


def sample_on(r: Remote, unit: str, health_status: int | None, probe: Probe, counters: dict[str, float]) -> Sample:
    """One soak sample: the HTTP side as measured, one generation, the unit's state from systemd."""
    ok, detail = probe.generate()
    st = unit_state(r, unit)
    return Sample(health_status, ok, detail, counters, st.active, st.restarts)


P = ParamSpec("P")


def shown(name: str) -> Callable[[Callable[Concatenate[RealOps, str, P], str | None]],
                                  Callable[Concatenate[RealOps, str, P], str | None]]:
    """A FleetOps call told to the display as a phase of the host (converge, preflight, ...): it
    starts, then ends ok when it returns None, failed (with the reason) otherwise."""
    def wrap(fn: Callable[Concatenate[RealOps, str, P], str | None]
             ) -> Callable[Concatenate[RealOps, str, P], str | None]:
        @functools.wraps(fn)
        def run(self: RealOps, host: str, /, *args: P.args, **kwargs: P.kwargs) -> str | None:
            self.sink(Step(host, name, phase=True))
            t0, why = time.monotonic(), "interrupted"
            try:
                why = fn(self, host, *args, **kwargs) or ""
                return why or None
            except Exception as err:
                why = (str(err) or type(err).__name__).splitlines()[0]
                raise
            finally:
                self.sink(Step(host, name, not why, round(time.monotonic() - t0, 3), why, phase=True))

        return run

    return wrap


@dataclass
class RealOps:
    run: RunOptions  # the rollout's options (run.reach: how its hosts are reached; run.gateway_*: its gateway)
    hosts: dict[str, FleetHost]
    image: str  # the candidate, resolved and pinned: REPO@sha256:...
    sink: Sink  # the rollout's display (results/display.py): what each host does and says
    pull_timeout_s: float = 1800.0

    @property
    def gateway_at(self) -> str:
        """Where the gateway runs: gateway.host (a host's name or an address), else host.address, else the
        first host (the canary: its gateway unit is another service than its server)."""
        first = next(iter(self.hosts.values())).target
        return self.run.gateway_host or gateway_target(self.run.stack, {n: h.target for n, h in self.hosts.items()},
                                                       first)

    @contextmanager
    def link(self, host: str, r: Remote) -> Iterator[GatewayLink | None]:
        """The gateway in front of `host` (connected: `r`), for as long as the block runs."""
        with gateway_link(self.run.reach, self.run.ssh, self.run.tunnel, self.stack_of(host),
                          gateway_at=self.gateway_at, server_at=self.hosts[host].target, server=r,
                          endpoint=self.endpoint(host, r)) as link:
            yield link

    def serving_port(self, host: str, r: Remote) -> int | None:
        """The port `host` serves its committed release on, when it does."""
        paths = paths_of(self.stack_of(host))
        st = read_state(r, paths)
        up = st.current is not None and units.is_active(r, paths.unit_of(st.slot))
        return st.current.port if up and st.current else None

    def stack_of(self, host: str) -> Stack:
        hs = host_stack(self.run.stack, self.hosts[host])
        # the registry channel moves once, when the whole rollout completed (runner.py), not per host
        return hs.model_copy(update={"host": hs.host.model_copy(update={"channel": None})})

    @contextmanager
    def remote(self, host: str) -> Iterator[Remote]:
        with self._connect(self.hosts[host].target) as r:
            yield r

    @contextmanager
    def _connect(self, target: str) -> Iterator[Remote]:
        r = self.run.reach.connect(parse_host(target), self.run.ssh)
        try:
            yield r
        finally:
            r.close()

    def say(self, host: str, lines: list[str]) -> None:
        """Lines for the person about this host (and the step log)."""
        for ln in lines:
            self.sink(Note(ln, host))

    def log(self, host: str, text: str) -> None:
        """A routine line about this host for the step log only (a drain that emptied, a rejoin):
        the rollout's output keeps to what a person acts on."""
        self.sink(Log(text, host))

    def _phase_steps(self, host: str) -> Sink:
        """The single-host steps inside a phase (a restore's): logged and shown, not announced plainly."""
        feed = bind(self.sink, host)

        def tell(ev: Event) -> None:
            feed(replace(ev, phase=True) if isinstance(ev, Step) else ev)

        return tell

    def endpoint(self, host: str, r: Remote) -> Endpoint:
        return Endpoint(r, parse_host(self.hosts[host].target), self.run.tunnel)

    def _converger(self, host: str, r: Remote, what: str) -> converge.Converger:
        hs = self.stack_of(host)
        rep = DeployReport(host=host, service=hs.host.service, stack=hs.label, image="-", strategy=what,
                           live=self._phase_steps(host))
        return converge.converger_for(hs, self.endpoint(host, r), rep, self.pull_timeout_s,
                                      http_probe=self.run.reach.http_probe(r), pace=self.run.reach.pace(r))

    # --- FleetOps ---------------------------------------------------------------
    @shown("converge")
    def converge(self, host: str) -> str | None:
        with self.remote(host) as r, self.link(host, r) as link:
            conv = self._converger(host, r, "converge")
            # what a killed run left in the pool (a candidate taking over) is drained before it stops; the
            # gateway step after preflight puts every serving host back in
            conv.link, conv.join = link, False
            did = converge.settle(r, paths_of(self.stack_of(host)), conv, run=self.lock_run(host))
        if did != "nothing to converge":
            self.say(host, [f"converged: {did}"])
        return None

    @shown("preflight")
    def preflight(self, host: str) -> str | None:
        with self.remote(host) as r:
            return preflight_on(r, self.stack_of(host), self.image)

    def gateway(self) -> str | None:
        if self.run.stack.gateway is None:
            return None
        at = next((n for n, h in self.hosts.items() if same_host(h.target, self.gateway_at)), None)
        serving = each(list(self.hosts), self._serving_url, 4)  # a gateway started anew starts with them
        first = sorted(u for u in serving.values() if isinstance(u, str))
        # its ports are checked first (host/gateway.py ensure)
        with self._connect(self.gateway_at) as r, gateway_link(
                self.run.reach, self.run.ssh, self.run.tunnel, self.run.stack, gateway_at=self.gateway_at,
                server_at=self.gateway_at, server=r, endpoint=Endpoint(r, parse_host(self.gateway_at), self.run.tunnel),
                image=self.run.gateway_image, pull_timeout_s=self.pull_timeout_s,
                prune=self.run.prune_workers) as link:
            assert link is not None
            said = link.bring_up(None, pool=first)
        self.sink(Note(f"fleet: gateway on {at or self.gateway_at}: {said}"))  # once per rollout
        # every host serving its committed release is in the pool: one a killed run drained goes back
        back = each(list(self.hosts), self._rejoin, 4)
        bad = {h: str(x).splitlines()[0] for h, x in back.items() if isinstance(x, Exception)}
        return "; ".join(f"{h}: not put back into the gateway ({why})" for h, why in bad.items()) or None

    def _serving_url(self, host: str) -> str | None:
        with self.remote(host) as r:
            port = self.serving_port(host, r)
        return None if port is None else worker_url(self.hosts[host].target, port, hostname(self.gateway_at))

    def _rejoin(self, host: str) -> str | None:
        with self.remote(host) as r, self.link(host, r) as link:
            port = self.serving_port(host, r)
            if link is None or port is None:
                return None
            # a gateway that restarts (Restart=always: killed, say) is waited for, within the join bound
            wait_answering(link.api, link.join_timeout_s)
            return link.join(port)

    def view(self, host: str) -> HostView:
        with self.remote(host) as r:
            return view_on(r, self.stack_of(host), self.image)

    @shown("pull")
    def pull(self, host: str) -> str | None:
        with self.remote(host) as r:
            units.ensure_image(r, self.image, self.pull_timeout_s)
        return None

    def deploy(self, host: str) -> DeployResult:
        """Out of the gateway (drained: bounded; one that does not empty goes back, exit 4), the host's own
        deploy (gated directly, into the gateway again only once it passed and serves, or on its
        incumbent when it failed), then whatever the host serves back in the pool."""
        hs = self.stack_of(host)
        if hs.gateway is not None:
            with self.remote(host) as r, self.link(host, r) as link:
                port = self.serving_port(host, r)
                if link is not None and port is not None:
                    try:
                        self.log(host, f"gateway: {link.leave_or_back(port)}")
                    except StackbuildError as err:
                        # the gateway may have gone mid-drain (killed, restarting) with the host already out
                        # of its pool file: it serves, so it goes back in, or the summary names it
                        self.say(host, [f"gateway: {err}"])
                        return DeployResult("refused", EXIT_INFRA, cause=str(err).splitlines()[0],
                                            out_of_gateway=self._rejoin_safely(host))
        try:
            result = self._deploy(host, hs)
        except BaseException:
            if hs.gateway is not None:
                self._rejoin_safely(host)
            raise
        if hs.gateway is not None and (why := self._rejoin_safely(host)) is not None:
            result = replace(result, out_of_gateway=why)
        return result

    def _rejoin_safely(self, host: str) -> str | None:
        """Whatever `host` serves back in the gateway; None when it is, else why not (said, and named in
        the rollout's summary: the next rollout puts it back)."""
        try:
            said = self._rejoin(host)
        except StackbuildError as err:
            why = str(err).splitlines()[0]
            self.say(host, [f"gateway: NOT back in the gateway: {why}; the next rollout puts it back"])
            return why
        if said:
            self.log(host, f"gateway: {said}")
        return None

    def _deploy(self, host: str, hs: Stack) -> DeployResult:
        reports: list[DeployReport] = []
        args = deploy_args(replace(self.run, image=self.image, gateway_host=self.gateway_at, drained=True,
                                   lock_run=self.lock_run(host)), stack=hs, host_text=self.hosts[host].target)
        feed = bind(self.sink, host)
        try:  # its steps to the rollout's display, its report and what it recorded to the rollout's log
            code = run_deploy(args, echo=lambda text: feed(Log(text)), reports=reports, sink=feed)
        except Exception as err:
            # an error out of run_deploy may follow a promotion (a bug past the decision), so ask
            # the host what it runs rather than guess
            why = f"deploy did not finish cleanly: {(str(err) or type(err).__name__).splitlines()[0]}"
            self.say(host, [why])
            on_candidate = self.view(host).on_candidate
            if not isinstance(err, StackbuildError) and not on_candidate:
                raise
            if on_candidate:
                return DeployResult("promoted", 0, None, f"promoted; {why}")
            return DeployResult("failed", getattr(err, "exit_code", 4), cause=str(err).splitlines()[0])
        return result_of(reports[-1], code)

    @shown("soak")
    def soak(self, host: str, seconds: float, interval_s: float) -> str | None:
        hs = self.stack_of(host)
        with self.remote(host) as r:
            state = read_state(r, paths_of(hs))
            unit = paths_of(hs).unit_of(state.slot)
            port = state.current.port if state.current else hs.runtime.port
            with self.endpoint(host, r)(port) as url:
                res = self._soak(r, url, unit, seconds, interval_s)
        self.say(host, [f"soak: {'held' if res.ok else 'REGRESSED'}: {res.detail}"])
        return None if res.ok else res.detail

    def _soak(self, r: Remote, url: str, unit: str, seconds: float, interval_s: float) -> SoakResult:
        probe, pace = self.run.reach.http_probe(r)(url), self.run.reach.pace(r)

        def sample() -> Sample:
            health, metrics = self.run.reach.watch(r, url)
            return sample_on(r, unit, health, probe, parse_counters(metrics))

        return soak(sample, seconds, interval_s, clock=pace.clock, sleep=pace.sleep)

    @shown("revert")
    def revert(self, host: str) -> str | None:
        with self.remote(host) as r, self.link(host, r) as link:
            conv = self._converger(host, r, "rollback")
            conv.link = link  # drained before it stops, back in once the incumbent serves
            converge.rollback(r, paths_of(self.stack_of(host)), conv, run=self.lock_run(host))
        self.say(host, ["reverted to the incumbent: " + (conv.report.cause or conv.report.outcome)])
        return None

    def lock_run(self, host: str) -> str:
        """Who owns `host`'s lock: this rollout on that host, never just this process (its threads share
        the pid; two of them must not break each other's locks)."""
        return f"{self.run.lock_run or 'rollout'}/{host}"

    def host_class(self, host: str) -> str:
        h, hs = self.hosts[host], self.stack_of(host)
        return host_class(hs.runtime.gpus, h.gpu_model, hs.host.driver)
