"""Soak: watch promoted hosts for a bake time; a regression rolls the wave back.

Each sample is what an operator would watch: `/health_generate` (sglang runs a
one-token generation through the scheduler for it), one small real generation
(synthetic traffic, so a server that breaks under use is seen even when no
user is sending), `/metrics` counters and the unit's state from systemd. The
judging is pure (`judge`); `soak` loops over a `Sampler`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

# Prometheus text: name{labels} value — counters only (…_total)
_COUNTER = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*_total)(?:\{[^}]*\})?\s+(?P<value>[-+0-9.eE]+|NaN)\s*$")
_ERRORISH = re.compile(r"(abort|error|fail|timeout)", re.I)
# sglang counts every request it finished; going down means the process started over
RESTART_HINT = "sglang:num_requests_total"


@dataclass(frozen=True)
class Sample:
    health_status: int | None  # /health_generate HTTP status (None: no answer)
    generate_ok: bool
    generate_detail: str
    counters: dict[str, float] = field(default_factory=dict)  # summed over label sets
    active: str = "active"
    restarts: int = 0


def parse_counters(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _COUNTER.match(line.strip())
        if m and m["value"] != "NaN":
            out[m["name"]] = out.get(m["name"], 0.0) + float(m["value"])
    return out


def judge(first: Sample, cur: Sample) -> list[str]:
    """Regressions in `cur` against the soak's first sample (empty: healthy)."""
    bad = []
    if cur.active != "active":
        bad.append(f"unit is {cur.active}")
    if cur.restarts > first.restarts:
        bad.append(f"systemd restarted the server {cur.restarts - first.restarts} time(s)")
    if cur.health_status != 200:
        bad.append(f"/health_generate answered {cur.health_status or 'nothing'}")
    if not cur.generate_ok:
        bad.append(f"a generation failed: {cur.generate_detail}")
    for name, v in sorted(cur.counters.items()):
        before = first.counters.get(name)
        if before is None:
            continue
        if v < before:
            bad.append(f"{name} went down ({before:g} -> {v:g}): the server restarted")
        elif v > before and _ERRORISH.search(name):
            bad.append(f"{name} rose by {v - before:g}")
    return bad


class Sampler(Protocol):
    def __call__(self) -> Sample: ...


@dataclass
class SoakResult:
    ok: bool
    samples: int
    detail: str


def soak(
    sample: Sampler,
    seconds: float,
    interval_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> SoakResult:
    """Sample until `seconds` have passed; the first regression ends the soak as failed."""
    first = sample()
    n = 1
    bad = judge(first, first)
    if bad:
        return SoakResult(False, n, "; ".join(bad))
    deadline = clock() + seconds
    while clock() < deadline:
        sleep(interval_s)
        cur = sample()
        n += 1
        bad = judge(first, cur)
        if bad:
            return SoakResult(False, n, "; ".join(bad))
    return SoakResult(True, n, f"{n} samples healthy over {seconds:g}s")
