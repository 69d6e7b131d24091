"""The gateway in memory: the `Gateway` of effects/gateway.py, on a clock the caller's poller shares.

A worker joins the pool `join_s` after `add` (smg probes it first) unless it is in
`down` (never answers); `remove` takes it out at once and its running requests run
on, as smg's removal with a settle of 0 does. `send()` is one client request through
the gateway: it runs `request_s` on a routable worker (round robin), or fails when
none is routable -- the count the fleet's gateway logic must keep at zero.
`in_flight_of(worker)` is that worker's own count, what `drain` waits on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stackbuild.effects.gateway import READY, Worker, norm
from stackbuild.effects.readiness import Pace
from stackbuild.errors import InfraError


@dataclass
class FakeClock:
    """Time that passes only when someone sleeps: share `pace` with the code under test."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def pace(self, interval_s: float = 0.2) -> Pace:
        return Pace(interval_s=interval_s, clock=self, sleep=self.sleep)


@dataclass
class FakeGateway:
    pace: Pace
    url: str = "http://127.0.0.1:30080"
    join_s: float = 1.0
    request_s: float = 2.0
    down: set[str] = field(default_factory=set)
    calls: list[str] = field(default_factory=list)  # "add URL" | "remove URL", in order
    sent: int = 0
    failed: int = 0
    _ready_at: dict[str, float] = field(default_factory=dict)
    _ids: dict[str, str] = field(default_factory=dict)
    _running: dict[str, list[float]] = field(default_factory=dict)  # worker -> end times
    _turn: int = 0

    def start(self, *workers: str) -> FakeGateway:
        """Workers already serving when the gateway starts (its unit's --worker-urls)."""
        for w in workers:
            self._ready_at[norm(w)] = self.pace.clock()
        return self

    def workers(self) -> list[Worker]:
        now = self.pace.clock()
        return [self._worker(u) for u, at in self._ready_at.items() if at <= now]

    def _worker(self, url: str) -> Worker:
        wid = self._ids.setdefault(url, f"fake-{len(self._ids)}")
        return Worker(wid, url, READY, True, len(self._live(url)))

    def add(self, worker: str, *, timeout_s: float) -> Worker:
        url, t0 = norm(worker), self.pace.clock()
        self.calls.append(f"add {url}")
        if url not in self._ready_at and url not in self.down:
            self._ready_at[url] = t0 + self.join_s
        while url not in self._ready_at or self._ready_at[url] > self.pace.clock():
            if self.pace.clock() - t0 >= timeout_s:
                raise InfraError(f"gateway {self.url}: {url} not ready after {timeout_s:.0f}s")
            self.pace.sleep(self.pace.interval_s)
        return self._worker(url)

    def remove(self, worker: str, *, timeout_s: float) -> bool:
        url = norm(worker)
        self.calls.append(f"remove {url}")
        return self._ready_at.pop(url, None) is not None

    def send(self) -> str | None:
        """One request through the gateway: the worker it runs on, or None (a failed request)."""
        self.sent += 1
        pool = sorted(w.url for w in self.workers())
        if not pool:
            self.failed += 1
            return None
        url = pool[self._turn % len(pool)]
        self._turn += 1
        self._running.setdefault(url, []).append(self.pace.clock() + self.request_s)
        return url

    def _live(self, url: str) -> list[float]:
        return [t for t in self._running.get(url, []) if t > self.pace.clock()]

    def in_flight_of(self, worker: str) -> float | None:
        url = norm(worker)
        return None if url in self.down else float(len(self._live(url)))
