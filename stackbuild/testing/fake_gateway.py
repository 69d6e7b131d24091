"""The gateway in memory: the `Gateway` of effects/gateway.py, on a clock the caller's poller shares.

A worker joins the pool `join_s` after `add` (smg probes it first) once it answers
(`serves(url)`; default: unless it is in `down`); `remove` takes it out at once and its
running requests run on, as smg's removal with a settle of 0 does. `send()` is one client
request through the gateway: it runs `request_s` on a routable worker that answers (round
robin; smg retries a dead one elsewhere), or fails when there is none; a request whose
worker stops answering before it ends fails too (smg does not retry a stream that has
begun). `failed` is the count the fleet's gateway logic must keep at zero.
`key`: the control-plane key it started with (None: an open gateway); `client(key)` is a caller
presenting `key`, refused as smg refuses it (`Unauthorized`, its HTTP 401) when it is not that one.
`in_flight_of(worker)` is that worker's own count, what `drain` waits on. `up()` false:
the gateway itself does not answer (its unit is not running). A rollout's wave calls it from
one thread per host, as smg serves concurrent callers: every method holds one lock (a dict
changed by one host's `remove` while another's `workers()` iterated it was a failed run).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from stackbuild.effects.gateway import READY, Worker, norm, refused
from stackbuild.effects.http import NoAnswer
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
    serves: Callable[[str], bool] | None = None  # does the server at this URL answer (None: all but `down`)
    up: Callable[[], bool] = lambda: True
    key: str | None = field(default=None, repr=False)  # the control-plane key it takes (None: open)
    refusals: int = 0  # control-plane calls refused for their key
    calls: list[str] = field(default_factory=list)  # "add URL" | "remove URL", in order
    sent: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)  # why each failed request failed
    _ready_at: dict[str, float] = field(default_factory=dict)
    _ids: dict[str, str] = field(default_factory=dict)
    _running: dict[str, list[float]] = field(default_factory=dict)  # worker -> end times
    _turn: int = 0
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def start(self, *workers: str) -> FakeGateway:
        """Workers already serving when the gateway starts (its unit's --worker-urls)."""
        with self._lock:  # called from `up()`, which any host's thread may be the first to ask
            for w in workers:
                self._ready_at[norm(w)] = self.pace.clock()
        return self

    def _answers(self, url: str) -> bool:
        return url not in self.down and (self.serves is None or self.serves(url))

    def _check_up(self) -> None:
        if not self.up():
            raise NoAnswer("GET", f"{self.url}/workers", "ConnectionRefusedError: refused")

    def workers(self) -> list[Worker]:
        self._check_up()
        with self._lock:
            now = self.pace.clock()
            return [self._worker(u) for u, at in self._ready_at.items() if at <= now]

    def _worker(self, url: str) -> Worker:
        wid = self._ids.setdefault(url, f"fake-{len(self._ids)}")
        return Worker(wid, url, READY, True, len(self._live(url)))

    def add(self, worker: str, *, timeout_s: float) -> Worker:
        self._check_up()
        url, t0 = norm(worker), self.pace.clock()
        with self._lock:
            self.calls.append(f"add {url}")
            if url not in self._ready_at:
                self._ready_at[url] = t0 + self.join_s
        while True:
            with self._lock:
                ready = self._ready_at.get(url)
                if ready is None:  # removed while it was joining (another caller)
                    raise InfraError(f"gateway {self.url}: {url} was removed while it joined")
                if ready <= self.pace.clock() and self._answers(url):
                    return self._worker(url)
                if self.pace.clock() - t0 >= timeout_s:
                    self._ready_at.pop(url, None)  # smg's registration job failed: not listed
                    raise InfraError(f"gateway {self.url}: {url} not ready after {timeout_s:.0f}s")
            self.pace.sleep(self.pace.interval_s)  # outside the lock: the other hosts go on

    def remove(self, worker: str, *, timeout_s: float) -> bool:
        self._check_up()
        url = norm(worker)
        with self._lock:
            self.calls.append(f"remove {url}")
            return self._ready_at.pop(url, None) is not None

    def lost(self) -> None:
        """Requests still running on a server that stopped answering: failed (their stream broke)."""
        with self._lock:
            self._lost()

    def _lost(self) -> None:
        now = self.pace.clock()
        for url, ends in list(self._running.items()):
            live = [t for t in ends if t > now]  # the ended ones are dropped: the lists stay short
            if live and not self._answers(url):
                self.failed += len(live)
                self.failures.extend(f"{url} stopped with the request in flight" for _ in live)
                live = []
            self._running[url] = live

    def send(self) -> str | None:
        """One request through the gateway: the worker it runs on, or None (a failed request)."""
        with self._lock:
            return self._send()

    def _send(self) -> str | None:
        self._lost()
        self.sent += 1
        pool = sorted(w.url for w in self.workers() if self._answers(w.url)) if self.up() else []
        if not pool:
            self.failed += 1
            self.failures.append("no worker to route to" if self.up() else "the gateway does not answer")
            return None
        url = pool[self._turn % len(pool)]
        self._turn += 1
        self._running.setdefault(url, []).append(self.pace.clock() + self.request_s)
        return url

    def _live(self, url: str) -> list[float]:
        return [t for t in self._running.get(url, []) if t > self.pace.clock()]

    def in_flight_of(self, worker: str) -> float | None:
        url = norm(worker)
        with self._lock:
            return float(len(self._live(url))) if self._answers(url) else None

    def client(self, key: str | None) -> FakeClient:
        """The gateway as a caller presenting `key` (in `Authorization: Bearer`) reaches it."""
        return FakeClient(self, key)


@dataclass
class FakeClient:
    """A caller of a FakeGateway's control plane with a key: each call refused unless it is the gateway's."""

    gw: FakeGateway
    key: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return self.gw.url

    @property
    def pace(self) -> Pace:
        return self.gw.pace

    def _auth(self, what: str) -> None:
        self.gw._check_up()
        if self.gw.key is not None and self.key != self.gw.key:
            with self.gw._lock:
                self.gw.refusals += 1
            raise refused(self.gw.url, what, 401)

    def workers(self) -> list[Worker]:
        self._auth("GET /workers")
        return self.gw.workers()

    def add(self, worker: str, *, timeout_s: float) -> Worker:
        self._auth("POST /workers")
        return self.gw.add(worker, timeout_s=timeout_s)

    def remove(self, worker: str, *, timeout_s: float) -> bool:
        self._auth("DELETE /workers")
        return self.gw.remove(worker, timeout_s=timeout_s)
