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
from stackbuild.errors import StackbuildError
from stackbuild.fleet.inventory import host_stack
from stackbuild.fleet.plan import host_class, spread
from stackbuild.fleet.rollout import DeployResult, HostView
from stackbuild.fleet.soak import Sample, parse_counters, soak
from stackbuild.gate.result import GateResult
from stackbuild.host import converge, units
from stackbuild.host.outcome import DeployReport
from stackbuild.host.preflight import run_preflight
from stackbuild.host.session import Endpoint, RunOptions, deploy_args, run_deploy
from stackbuild.host.ssh import Remote, parse_host
from stackbuild.host.state import HostPaths, read_state
from stackbuild.host.unit_probe import unit_state
from stackbuild.render.stack import render_unit
from stackbuild.results.display import Event, Log, Note, Sink, Step, bind
from stackbuild.spec.fleet import FleetHost
from stackbuild.spec.stack import Stack


def paths_of(hs: Stack) -> HostPaths:
    return HostPaths(hs.host.state_dir, hs.host.service)


def preflight_on(r: Remote, hs: Stack, image: str) -> str | None:
    """The single deploy's preflight, with the same ports (ours may be held by our own incumbent)."""
    paths = paths_of(hs)
    state = read_state(r, paths)
    active = state.current is not None and units.is_active(r, paths.main_unit)
    pf = run_preflight(r, hs, image=image, strategy=hs.host.strategy, incumbent_active=active)
    return None if pf.ok else "; ".join(f"{c.name}: {c.detail}" for c in pf.failures)


def view_on(r: Remote, hs: Stack, image: str) -> HostView:
    st = converge.status(r, paths_of(hs))
    cur = st.state.current
    want = render_unit(hs, image=image, port=hs.runtime.port, name=hs.host.service)
    return HostView(
        on_candidate=bool(cur and cur.image == image and cur.unit == want and st.active),
        image=cur.image if cur else None,
        verdict=st.state.last_verdict,
        pending=st.state.pending is not None,
        lock=st.lock_owner or None,
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
    run: RunOptions  # the rollout's options (run.reach: how its hosts are reached)
    hosts: dict[str, FleetHost]
    image: str  # the candidate, resolved and pinned: REPO@sha256:...
    sink: Sink  # the rollout's display (results/display.py): what each host does and says
    pull_timeout_s: float = 1800.0

    def stack_of(self, host: str) -> Stack:
        hs = host_stack(self.run.stack, self.hosts[host])
        # the registry channel moves once, when the whole rollout completed (runner.py), not per host
        return hs.model_copy(update={"host": hs.host.model_copy(update={"channel": None})})

    @contextmanager
    def remote(self, host: str) -> Iterator[Remote]:
        r = self.run.reach.connect(parse_host(self.hosts[host].target), self.run.ssh)
        try:
            yield r
        finally:
            r.close()

    def say(self, host: str, lines: list[str]) -> None:
        """Lines for the person about this host (and the step log)."""
        for ln in lines:
            self.sink(Note(ln, host))

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
        with self.remote(host) as r:
            did = converge.settle(r, paths_of(self.stack_of(host)), self._converger(host, r, "converge"))
        if did != "nothing to converge":
            self.say(host, [f"converged: {did}"])
        return None

    @shown("preflight")
    def preflight(self, host: str) -> str | None:
        with self.remote(host) as r:
            return preflight_on(r, self.stack_of(host), self.image)

    def view(self, host: str) -> HostView:
        with self.remote(host) as r:
            return view_on(r, self.stack_of(host), self.image)

    @shown("pull")
    def pull(self, host: str) -> str | None:
        with self.remote(host) as r:
            units.ensure_image(r, self.image, self.pull_timeout_s)
        return None

    def deploy(self, host: str) -> DeployResult:
        hs = self.stack_of(host)
        reports: list[DeployReport] = []
        args = deploy_args(replace(self.run, image=self.image), stack=hs, host_text=self.hosts[host].target)
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
        with self.remote(host) as r, self.endpoint(host, r)(hs.runtime.port) as url:
            probe, pace = self.run.reach.http_probe(r)(url), self.run.reach.pace(r)

            def sample() -> Sample:
                health, metrics = self.run.reach.watch(r, url)
                return sample_on(r, paths_of(hs).main_unit, health, probe, parse_counters(metrics))

            res = soak(sample, seconds, interval_s, clock=pace.clock, sleep=pace.sleep)
        self.say(host, [f"soak: {'held' if res.ok else 'REGRESSED'}: {res.detail}"])
        return None if res.ok else res.detail

    @shown("revert")
    def revert(self, host: str) -> str | None:
        with self.remote(host) as r:
            conv = self._converger(host, r, "rollback")
            converge.rollback(r, paths_of(self.stack_of(host)), conv)
        self.say(host, ["reverted to the incumbent: " + (conv.report.cause or conv.report.outcome)])
        return None

    def host_class(self, host: str) -> str:
        h, hs = self.hosts[host], self.stack_of(host)
        return host_class(hs.runtime.gpus, h.gpu_model, hs.host.driver)
