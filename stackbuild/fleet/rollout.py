"""Run a rollout plan against the hosts through `FleetOps` (real: ops.py; tests: a fake).

Order: converge every host (what a killed run left there, its lock, pending marker and
candidate, is put back first), preflight every host (one failure refuses the rollout,
nothing deployed), read where each host stands (hosts already on the candidate are
skipped: a re-run resumes), pull everywhere (bounded), then wave by wave: deploy the
wave's hosts in parallel, collect every result, flag outliers against the canary, soak,
and decide for the whole wave.

A resumed rollout (`Prior`: the same rollout id, re-run) starts from the rows it recorded;
a host this rollout promoted before it was killed counts as promoted, and one whose wave
never settled (killed while deploying the wave's other hosts or soaking it) is soaked and
decided with its wave again rather than skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol, TypeVar

from stackbuild.errors import EXIT_GATE_FAILED, EXIT_INCONCLUSIVE, EXIT_INFRA, EXIT_OK
from stackbuild.fleet.plan import PASSED, WaveDecision, decide_wave, outliers, remaining

SOAK_FAILED = "soak-failed"


@dataclass(frozen=True)
class HostView:
    on_candidate: bool  # runs exactly the candidate release (image and unit), nothing pending
    image: str | None = None
    verdict: str | None = None
    pending: bool = False
    lock: str | None = None
    active: bool = False
    since: str | None = None  # when its current release was promoted (ISO 8601, the deploying client's clock)


@dataclass(frozen=True)
class DeployResult:
    outcome: str  # promoted | rolled-back | refused | failed (the single-host outcomes)
    exit_code: int
    verdict: str | None = None
    cause: str | None = None
    medians: Mapping[int, float] = field(default_factory=dict)  # candidate output tok/s per level
    noise: Mapping[int, float] = field(default_factory=dict)  # relative spread of its runs per level
    out_of_gateway: str | None = None  # it serves, but could not be put back in the gateway: why


class FleetOps(Protocol):
    def converge(self, host: str) -> str | None: ...  # what a killed run left, put back; None: done
    def preflight(self, host: str) -> str | None: ...  # None: ready; else why not
    # the gateway in front of the fleet up to date, and every serving host in its pool (a host a killed
    # run drained put back); None: done, or no gateway
    def gateway(self) -> str | None: ...
    def view(self, host: str) -> HostView: ...
    def pull(self, host: str) -> str | None: ...
    def deploy(self, host: str) -> DeployResult: ...
    def soak(self, host: str, seconds: float, interval_s: float) -> str | None: ...  # None: held up
    def revert(self, host: str) -> str | None: ...  # back to the incumbent; None: done
    def host_class(self, host: str) -> str: ...


@dataclass
class HostRow:
    host: str
    wave: int
    outcome: str = "untouched"  # + already | promoted | rolled-back | refused | failed | soak-failed | reverted
    verdict: str | None = None
    detail: str = ""
    flagged: str | None = None
    medians: dict[int, float] = field(default_factory=dict)
    noise: dict[int, float] = field(default_factory=dict)


class Recorder(Protocol):
    def host(self, row: HostRow) -> None: ...
    def finish(self, outcome: str, cause: str | None) -> None: ...


@dataclass(frozen=True)
class Settings:
    policy: str = "halt"
    soak_s: float = 0.0
    soak_interval_s: float = 1.0
    pull_parallel: int = 4
    outlier_tolerance: float = 0.1


@dataclass(frozen=True)
class Prior:
    """The rollout being resumed: when it started and the rows it recorded."""

    started_at: datetime
    rows: Mapping[str, HostRow]

    def promoted_it(self, since: str | None) -> bool:
        """Was a release promoted at `since` promoted by this rollout (after it started)?"""
        if not since:
            return False
        try:
            at = datetime.fromisoformat(since)
        except ValueError:
            return False
        return at >= self.started_at.replace(microsecond=0)  # the state's times are whole seconds


@dataclass
class RolloutResult:
    outcome: str = "running"  # completed | stopped | refused
    exit_code: int = EXIT_OK
    cause: str | None = None
    rows: dict[str, HostRow] = field(default_factory=dict)


T = TypeVar("T")


def each(hosts: Iterable[str], fn: Callable[[str], T], limit: int) -> dict[str, T | Exception]:
    """fn on every host, at most `limit` at once; every host reports (an exception is its result)."""
    hosts = list(hosts)
    if not hosts:
        return {}

    def safe(h: str) -> T | Exception:
        try:
            return fn(h)
        except Exception as err:  # one host's failure is that host's result, not the rollout's crash
            return err

    with ThreadPoolExecutor(max_workers=max(1, min(limit, len(hosts)))) as pool:
        return dict(zip(hosts, pool.map(safe, hosts), strict=True))


def _why(x: object) -> str | None:
    if isinstance(x, Exception):
        return (str(x) or type(x).__name__).splitlines()[0]
    return x if isinstance(x, str) else None


def run_rollout(
    waves: list[list[str]],
    ops: FleetOps,
    settings: Settings,
    rec: Recorder,
    echo: Callable[[str], None] = print,
    reference: Mapping[int, float] | None = None,
    prior: Prior | None = None,
) -> RolloutResult:
    return _Rollout(waves, ops, settings, rec, echo, prior, ref=dict(reference or {})).run()


@dataclass
class _Rollout:
    """One rollout's run, a method per step: prepare every host, then each wave (deploy, outliers,
    soak, decide). A step that ends the rollout returns its result (`stop`), else None."""

    waves: list[list[str]]
    ops: FleetOps
    settings: Settings
    rec: Recorder
    echo: Callable[[str], None]
    prior: Prior | None
    ref: dict[int, float]  # the canary's medians (or the given reference) the others are compared with
    res: RolloutResult = field(default_factory=RolloutResult)
    left_out: dict[str, str] = field(default_factory=dict)  # hosts that serve but are not in the gateway
    done: set[str] = field(default_factory=set)  # on the candidate with their wave decided: skipped
    unsettled: set[str] = field(default_factory=set)  # promoted by this rollout, their wave not decided
    promoted_before: list[str] = field(default_factory=list)

    @property
    def everyone(self) -> list[str]:
        return [h for w in self.waves for h in w]

    def run(self) -> RolloutResult:
        self.start_rows()
        if (stopped := self.prepare()) is not None:
            return stopped
        self.promoted_before = [h for h in self.everyone if h in self.done]
        for i, hosts in remaining(self.waves, self.done):
            if (stopped := self.wave(i, hosts)) is not None:
                return stopped
        return self.stop("completed", EXIT_OK, f"every host runs the candidate ({len(self.everyone)} host(s))")

    def start_rows(self) -> None:
        prior = self.prior
        for i, wave in enumerate(self.waves):
            for h in wave:
                # a resumed rollout keeps the hosts it promoted; the rest start over
                old = prior.rows.get(h) if prior else None
                self.res.rows[h] = replace(old, wave=i) if old and old.outcome in (PASSED, "already") else HostRow(h, i)
                if prior is not None:
                    self.rec.host(self.res.rows[h])

    def stop(self, outcome: str, code: int, cause: str) -> RolloutResult:
        res = self.res
        if self.left_out:  # never silent: a host out of the pool is capacity lost until the next run puts it back
            names = ", ".join(f"{h} ({why})" for h, why in sorted(self.left_out.items()))
            cause = f"{cause}; NOT in the gateway though serving: {names}; the next rollout puts them back"
            code = code or EXIT_INFRA
        res.outcome, res.exit_code, res.cause = outcome, code, cause
        for row in res.rows.values():
            self.rec.host(row)
        self.rec.finish(outcome, cause)  # the caller says how it ended, under its table
        return res

    def refused(self, step: str, results: Mapping[str, object]) -> str:
        """Mark every host whose `step` reported a problem; their names, or "" when none did."""
        bad = {h: _why(r) for h, r in results.items() if r is not None}
        for h, why in bad.items():
            self.res.rows[h].outcome, self.res.rows[h].detail = "refused", f"{step}: {why}"
        return ", ".join(sorted(bad))

    def prepare(self) -> RolloutResult | None:
        """Converge, preflight, the gateway, where each host stands, pull: any failure refuses the rollout."""
        everyone, ops, n = self.everyone, self.ops, self.settings.pull_parallel
        self.echo(f"fleet: converging {len(everyone)} host(s): what an interrupted run left is put back first")
        if names := self.refused("converge", each(everyone, ops.converge, n)):
            return self.stop("refused", EXIT_INFRA, f"cannot converge {names}; nothing was deployed")
        self.echo(f"fleet: preflight of {len(everyone)} host(s)")
        if names := self.refused("preflight", each(everyone, ops.preflight, n)):
            return self.stop("refused", EXIT_INFRA, f"preflight failed on {names}; no host was changed")
        try:
            why = ops.gateway()
        except Exception as err:  # the rollout's refusal, not its crash
            why = _why(err)
        if why is not None:
            return self.stop("refused", EXIT_INFRA, f"gateway: {why}; no server was changed")
        if (stopped := self.where_hosts_stand()) is not None:
            return stopped
        todo = [h for h in everyone if h not in self.done]
        self.echo(f"fleet: pulling the candidate on {len(todo)} host(s), {n} at a time")
        if names := self.refused("pull", each(todo, ops.pull, n)):
            return self.stop("refused", EXIT_INFRA, f"pull failed on {names}; no service was changed")
        return None

    def where_hosts_stand(self) -> RolloutResult | None:
        """Hosts on the candidate already are skipped (`done`), or soaked and decided with their wave
        again when this rollout promoted them and was interrupted before it decided it (`unsettled`)."""
        everyone, prior = self.everyone, self.prior
        for h, v in each(everyone, self.ops.view, self.settings.pull_parallel).items():
            row = self.res.rows[h]
            if isinstance(v, Exception):
                row.outcome, row.detail = "refused", f"state: {_why(v)}"
                return self.stop("refused", EXIT_INFRA, f"cannot read the state of {h}; no host was changed")
            if not v.on_candidate or v.pending:
                continue
            if row.outcome == PASSED:  # promoted by this rollout, its wave decided: nothing left to do
                self.done.add(h)
            elif prior is not None and prior.promoted_it(v.since):  # promoted by it, its wave not decided
                self.unsettled.add(h)
                row.outcome, row.verdict, row.detail = PASSED, v.verdict, "promoted before the rollout was interrupted"
            else:
                self.done.add(h)
                row.outcome, row.verdict, row.detail = "already", v.verdict, "already runs the candidate"
        if self.done:
            self.echo(f"fleet: already on the candidate, skipped: {', '.join(h for h in everyone if h in self.done)}")
        if self.unsettled:
            self.echo(f"fleet: promoted before the interruption, soaked and decided with their wave: "
                      f"{', '.join(h for h in everyone if h in self.unsettled)}")
        return None

    def wave(self, i: int, hosts: list[str]) -> RolloutResult | None:
        label = "canary" if i == 0 else f"wave {i}"
        self.echo(f"\nfleet: {label}: {', '.join(hosts)}")
        results, outcomes = self.deploy(hosts)
        self.flag_outliers(hosts, results, outcomes)
        self.soak(label, hosts, outcomes)
        for h in hosts:
            row = self.res.rows[h]
            self.echo(f"  {h}: {row.outcome}" + (f" ({row.verdict})" if row.verdict else "")
                      + (f": {row.detail.splitlines()[0][:160]}" if row.detail and row.outcome != PASSED else ""))
        decision = decide_wave(outcomes, self.promoted_before, self.settings.policy, on_candidate=(PASSED, SOAK_FAILED))
        if decision.go_on:
            for h in hosts:
                self.rec.host(self.res.rows[h])
            self.promoted_before += hosts
            return None
        self.echo(f"fleet: stop at {label}: {decision.why}")
        return self.revert(label, decision, results)

    def deploy(self, hosts: list[str]) -> tuple[dict[str, DeployResult | Exception], dict[str, str]]:
        """The wave's hosts deployed in parallel (its unsettled ones count as passed): results, outcomes."""
        results = each([h for h in hosts if h not in self.unsettled], self.ops.deploy, len(hosts))
        outcomes: dict[str, str] = {h: PASSED for h in hosts if h in self.unsettled}
        for h, r in results.items():
            row = self.res.rows[h]
            if isinstance(r, Exception):
                row.outcome, row.detail = "failed", f"deploy: {_why(r)}"
            else:
                row.outcome, row.verdict, row.detail = r.outcome, r.verdict, r.cause or ""
                row.medians, row.noise = dict(r.medians), dict(r.noise)
                if r.out_of_gateway is not None:
                    self.left_out[h] = r.out_of_gateway
                    row.detail = "; ".join(x for x in ("NOT in the gateway (serving)", row.detail) if x)
            outcomes[h] = row.outcome
        return results, outcomes

    def flag_outliers(self, hosts: list[str], results: Mapping[str, object], outcomes: Mapping[str, str]) -> None:
        """Passed hosts of the canary's class whose medians read off the canary's are flagged."""
        rows, ref_host = self.res.rows, self.waves[0][0]
        if not self.ref and ref_host in results and outcomes.get(ref_host) == PASSED:
            self.ref = rows[ref_host].medians
        cls = self.ops.host_class(ref_host)
        same = {h: rows[h].medians for h in hosts if outcomes[h] == PASSED and h != ref_host
                and self.ops.host_class(h) == cls}
        noise = {h: rows[h].noise for h in same} | {"": rows[ref_host].noise}
        for h, why in outliers(self.ref, same, self.settings.outlier_tolerance, noise).items():
            rows[h].flagged = why
            self.echo(f"fleet: FLAGGED {h}: reads off its class ({cls}): {why}")

    def soak(self, label: str, hosts: list[str], outcomes: dict[str, str]) -> None:
        """A wave whose hosts all passed is watched for settings.soak_s; a host that does not hold up fails."""
        st = self.settings
        if not (st.soak_s > 0 and all(o == PASSED for o in outcomes.values())):
            return
        self.echo(f"fleet: soaking {label} for {st.soak_s:g}s")
        soaked = each(hosts, lambda h: self.ops.soak(h, st.soak_s, st.soak_interval_s), len(hosts))
        for h, sr in soaked.items():
            if sr is not None:
                self.res.rows[h].outcome, self.res.rows[h].detail = SOAK_FAILED, f"soak: {_why(sr)}"
                outcomes[h] = SOAK_FAILED

    def revert(self, label: str, decision: WaveDecision, results: Mapping[str, DeployResult | Exception]
               ) -> RolloutResult:
        """The hosts the decision names put back to their incumbent; the rollout stops with the exit code
        its failures call for (an infrastructure failure outranks a gate's)."""
        back = each(decision.revert, self.ops.revert, self.settings.pull_parallel)
        for h, br in back.items():
            row = self.res.rows[h]
            if br is None:
                row.detail = (f"{row.detail}; " if row.outcome != PASSED else "") + "put back to the incumbent"
                row.outcome = row.outcome if row.outcome == SOAK_FAILED else "reverted"
            else:
                row.outcome, row.detail = "failed", f"revert failed: {_why(br)}"
        codes = [r.exit_code for r in results.values() if isinstance(r, DeployResult) and r.outcome != PASSED]
        failed_infra = any(isinstance(r, Exception) for r in results.values()) or any(
            self.res.rows[h].outcome == "failed" for h in back)
        code = EXIT_INFRA if failed_infra or EXIT_INFRA in codes else (
            EXIT_INCONCLUSIVE if codes and all(c == EXIT_INCONCLUSIVE for c in codes) else EXIT_GATE_FAILED)
        return self.stop("stopped", code, f"{label} failed: {decision.why}")
