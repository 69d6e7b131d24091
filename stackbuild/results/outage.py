"""How long a swap leaves the service without a server, from the ledger's load times for the stack.

A swap stops the incumbent before the candidate starts (one host, the model does not fit twice),
so clients get no answer from the stop until the candidate serves. The ledger records every
deploy's step timings and measured outage: the estimate is the outage earlier deploys of the
same stack measured (`downtime_s`, stop to serving), else how long their candidates took to
start and become ready (a load, where nothing was stopped first).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from stackbuild.results.ledger import DeployRecord, Ledger
from stackbuild.spec.stack import Stack


def load_seconds(d: DeployRecord) -> float | None:
    """One deploy's outage, or its candidate's load time; None when it never served."""
    if d.downtime_s is not None:
        return d.downtime_s
    if "gate" not in d.durations or "switch" in d.durations:  # never ready, or two loads in "ready"
        return None
    return d.durations.get("start", 0.0) + d.durations.get("ready", 0.0)


def deploy_seconds(d: DeployRecord) -> float | None:
    """How long one deploy that promoted took, every step (a rollout's host is out of the pool for it)."""
    if d.outcome != "promoted" or not d.durations:
        return None
    return sum(d.durations.values())


def pool_outage(ledger: Path, stack: Stack, gate_deadline_s: float) -> str:
    """The plan's sentence for a wave that drains every host of the pool: no server in the gateway from
    the drain until the first host is back, i.e. one host's whole deploy; estimated from the deploys of
    `stack` the ledger recorded, else bounded by the timeouts."""
    samples: list[float] = []
    if ledger.exists():
        with Ledger(ledger) as db:
            samples = [s for d in db.deploys() if d.stack == stack.name and (s := deploy_seconds(d)) is not None]
    head = "the gateway has no server from the drain until the host is back: clients get errors for the whole deploy"
    if not samples:
        bound = stack.runtime.start_timeout_s + stack.runtime.ready_timeout_s + gate_deadline_s
        return (f"{head}; the ledger has no deploy of {stack.name} yet: at most {bound:g}s "
                "(runtime.start_timeout_s + ready_timeout_s + the gate's deadline)")
    return (f"{head}: about {statistics.median(samples):.1f}s (the median of {len(samples)} promoted deploy(s) of "
            f"{stack.name} in the ledger, the longest {max(samples):.1f}s)")


def swap_outage(ledger: Path, stack: Stack) -> str:
    """The plan's sentence: a swap's outage and its estimate for `stack` (its variants included)."""
    samples: list[float] = []
    if ledger.exists():
        with Ledger(ledger) as db:
            samples = [s for d in db.deploys() if d.stack == stack.name and (s := load_seconds(d)) is not None]
    head = "swap: the incumbent stops before the candidate starts, so clients get no answer until it serves"
    if not samples:
        bound = stack.runtime.start_timeout_s + stack.runtime.ready_timeout_s
        return (f"{head}; the ledger has no load time of {stack.name} yet: the outage lasts as long as the "
                f"candidate takes to load, at most {bound:g}s (runtime.start_timeout_s + ready_timeout_s)")
    return (f"{head}: about {statistics.median(samples):.1f}s (the median of {len(samples)} load(s) of "
            f"{stack.name} in the ledger, the longest {max(samples):.1f}s)")
