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
from stackbuild.fleet.plan import PASSED, decide_wave, outliers, remaining

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
    res = RolloutResult()
    for i, wave in enumerate(waves):
        for h in wave:
            # a resumed rollout keeps the hosts it promoted; the rest start over
            old = prior.rows.get(h) if prior else None
            res.rows[h] = replace(old, wave=i) if old and old.outcome in (PASSED, "already") else HostRow(h, i)
            if prior is not None:
                rec.host(res.rows[h])
    everyone = [h for w in waves for h in w]

    left_out: dict[str, str] = {}  # hosts that serve but are not in the gateway: named in the summary

    def stop(outcome: str, code: int, cause: str) -> RolloutResult:
        if left_out:  # never silent: a host out of the pool is capacity lost until the next run puts it back
            names = ", ".join(f"{h} ({why})" for h, why in sorted(left_out.items()))
            cause = f"{cause}; NOT in the gateway though serving: {names}; the next rollout puts them back"
            code = code or EXIT_INFRA
        res.outcome, res.exit_code, res.cause = outcome, code, cause
        for row in res.rows.values():
            rec.host(row)
        rec.finish(outcome, cause)  # the caller says how it ended, under its table
        return res

    def refused(step: str, results: Mapping[str, object]) -> str:
        """Mark every host whose `step` reported a problem; their names, or "" when none did."""
        bad = {h: _why(r) for h, r in results.items() if r is not None}
        for h, why in bad.items():
            res.rows[h].outcome, res.rows[h].detail = "refused", f"{step}: {why}"
        return ", ".join(sorted(bad))

    echo(f"fleet: converging {len(everyone)} host(s): what an interrupted run left is put back first")
    if names := refused("converge", each(everyone, ops.converge, settings.pull_parallel)):
        return stop("refused", EXIT_INFRA, f"cannot converge {names}; nothing was deployed")
    echo(f"fleet: preflight of {len(everyone)} host(s)")
    if names := refused("preflight", each(everyone, ops.preflight, settings.pull_parallel)):
        return stop("refused", EXIT_INFRA, f"preflight failed on {names}; no host was changed")
    try:
        why = ops.gateway()
    except Exception as err:  # the rollout's refusal, not its crash
        why = _why(err)
    if why is not None:
        return stop("refused", EXIT_INFRA, f"gateway: {why}; no server was changed")

    views = each(everyone, ops.view, settings.pull_parallel)
    done, unsettled = set(), set()
    for h, v in views.items():
        row = res.rows[h]
        if isinstance(v, Exception):
            row.outcome, row.detail = "refused", f"state: {_why(v)}"
            return stop("refused", EXIT_INFRA, f"cannot read the state of {h}; no host was changed")
        if not v.on_candidate or v.pending:
            continue
        if row.outcome == PASSED:  # promoted by this rollout, its wave decided: nothing left to do
            done.add(h)
        elif prior is not None and prior.promoted_it(v.since):  # promoted by it, its wave not decided
            unsettled.add(h)
            row.outcome, row.verdict, row.detail = PASSED, v.verdict, "promoted before the rollout was interrupted"
        else:
            done.add(h)
            row.outcome, row.verdict, row.detail = "already", v.verdict, "already runs the candidate"
    if done:
        echo(f"fleet: already on the candidate, skipped: {', '.join(h for h in everyone if h in done)}")
    if unsettled:
        echo(f"fleet: promoted before the interruption, soaked and decided with their wave: "
             f"{', '.join(h for h in everyone if h in unsettled)}")

    todo = [h for h in everyone if h not in done]
    echo(f"fleet: pulling the candidate on {len(todo)} host(s), {settings.pull_parallel} at a time")
    if names := refused("pull", each(todo, ops.pull, settings.pull_parallel)):
        return stop("refused", EXIT_INFRA, f"pull failed on {names}; no service was changed")

    ref = dict(reference or {})
    ref_host = waves[0][0]
    promoted_before = [h for h in everyone if h in done]
    for i, hosts in remaining(waves, done):
        label = "canary" if i == 0 else f"wave {i}"
        echo(f"\nfleet: {label}: {', '.join(hosts)}")
        results = each([h for h in hosts if h not in unsettled], ops.deploy, len(hosts))
        outcomes: dict[str, str] = {h: PASSED for h in hosts if h in unsettled}
        for h, r in results.items():
            row = res.rows[h]
            if isinstance(r, Exception):
                row.outcome, row.detail = "failed", f"deploy: {_why(r)}"
            else:
                row.outcome, row.verdict, row.detail = r.outcome, r.verdict, r.cause or ""
                row.medians, row.noise = dict(r.medians), dict(r.noise)
                if r.out_of_gateway is not None:
                    left_out[h] = r.out_of_gateway
                    row.detail = "; ".join(x for x in ("NOT in the gateway (serving)", row.detail) if x)
            outcomes[h] = row.outcome
        if not ref and ref_host in results and outcomes.get(ref_host) == PASSED:
            ref = res.rows[ref_host].medians
        cls = ops.host_class(ref_host)
        same = {h: res.rows[h].medians for h in hosts if outcomes[h] == PASSED and h != ref_host
                and ops.host_class(h) == cls}
        noise = {h: res.rows[h].noise for h in same} | {"": res.rows[ref_host].noise}
        for h, why in outliers(ref, same, settings.outlier_tolerance, noise).items():
            res.rows[h].flagged = why
            echo(f"fleet: FLAGGED {h}: reads off its class ({cls}): {why}")
        if settings.soak_s > 0 and all(o == PASSED for o in outcomes.values()):
            echo(f"fleet: soaking {label} for {settings.soak_s:g}s")
            soaked = each(hosts, lambda h: ops.soak(h, settings.soak_s, settings.soak_interval_s), len(hosts))
            for h, sr in soaked.items():
                if sr is not None:
                    res.rows[h].outcome, res.rows[h].detail = SOAK_FAILED, f"soak: {_why(sr)}"
                    outcomes[h] = SOAK_FAILED
        for h in hosts:
            row = res.rows[h]
            echo(f"  {h}: {row.outcome}" + (f" ({row.verdict})" if row.verdict else "")
                 + (f": {row.detail.splitlines()[0][:160]}" if row.detail and row.outcome != PASSED else ""))
        decision = decide_wave(outcomes, promoted_before, settings.policy, on_candidate=(PASSED, SOAK_FAILED))
        if decision.go_on:
            for h in hosts:
                rec.host(res.rows[h])
            promoted_before += hosts
            continue
        echo(f"fleet: stop at {label}: {decision.why}")
        back = each(decision.revert, ops.revert, settings.pull_parallel)
        for h, br in back.items():
            row = res.rows[h]
            if br is None:
                row.detail = (f"{row.detail}; " if row.outcome != PASSED else "") + "put back to the incumbent"
                row.outcome = row.outcome if row.outcome == SOAK_FAILED else "reverted"
            else:
                row.outcome, row.detail = "failed", f"revert failed: {_why(br)}"
        codes = [r.exit_code for r in results.values() if isinstance(r, DeployResult) and r.outcome != PASSED]
        failed_infra = any(isinstance(r, Exception) for r in results.values()) or any(
            res.rows[h].outcome == "failed" for h in back)
        code = EXIT_INFRA if failed_infra or EXIT_INFRA in codes else (
            EXIT_INCONCLUSIVE if codes and all(c == EXIT_INCONCLUSIVE for c in codes) else EXIT_GATE_FAILED)
        return stop("stopped", code, f"{label} failed: {decision.why}")
    return stop("completed", EXIT_OK, f"every host runs the candidate ({len(everyone)} host(s))")
