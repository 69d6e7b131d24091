"""The one owner of SGLang's gateway API (smg, the Shepherd Model Gateway): its workers, and draining one.

smg keeps its workers in a registry behind `/workers` (smg model_gateway/src/server.rs,
worker_routes): `GET /workers` lists them, `POST /workers {"url": ...}` queues a
registration (202; the worker answers `/server_info` as sglang, smg's detect_backend.rs,
and joins as `ready` once its health check passes), `DELETE /workers/{id}` queues a
removal (202) that first marks the worker `draining` -- no longer selected, its
in-flight requests run on -- for the worker's `drain_settle_secs`, then drops it
(workflow/steps/local/drain_workers.rs). The settle is a blind sleep: we add workers with
a settle of 0 and wait ourselves, on the worker's own count of what it has in flight
(its /metrics: `sglang:num_running_reqs` + `sglang:num_queue_reqs`), bounded.

Its control plane (`/workers`) takes a key: smg `--control-plane-api-keys`, sent as
`Authorization: Bearer KEY` (smg crates/auth middleware; without it, or with another, 401).
`HttpGateway` sends the one stackbuild made on the gateway's host (host/gateway.py).

`HttpGateway` is the gateway over HTTP; `FakeGateway` (testing/fake_gateway.py) the same
operations in memory, for the logic written against `Gateway`. `drain` is that logic's
one step: out of the pool, then wait until nothing is in flight. See docs/gateway.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from stackbuild.effects import http, prometheus
from stackbuild.effects.readiness import Pace
from stackbuild.errors import InfraError

# a worker smg may route to; the others are pending | not_ready | failed | draining (smg WorkerStatus)
READY = "ready"
# an idle worker must read 0 this many polls in a row: a request the gateway picked it for just
# before it left the pool may still be on its way
QUIET_POLLS = 2


@dataclass(frozen=True)
class Worker:
    id: str
    url: str
    status: str
    healthy: bool
    load: int  # requests the gateway has in flight on it

    @property
    def routable(self) -> bool:
        return self.status == READY


@dataclass(frozen=True)
class Drained:
    url: str
    ok: bool  # out of the pool and nothing in flight
    in_flight: float | None  # the last count read (None: unreadable)
    seconds: float
    detail: str


class Unauthorized(InfraError):
    """The gateway refused the control-plane key (HTTP 401/403): nothing was changed."""


def refused(url: str, what: str, status: int) -> Unauthorized:
    # never the key itself: this goes to the terminal, the step log and the ledger
    return Unauthorized(f"gateway {url}: {what}: HTTP {status}: it does not take stackbuild's control-plane key; "
                        "redeploy the stack so its unit runs with the key file stackbuild keeps on its host")


class Gateway(Protocol):
    url: str
    pace: Pace  # what waiting on it polls at (and on which clock)

    def workers(self) -> list[Worker]: ...

    def add(self, worker: str, *, timeout_s: float) -> Worker:
        """Put a worker in the pool and wait until it is routable (already there: a no-op)."""

    def remove(self, worker: str, *, timeout_s: float) -> bool:
        """Take a worker out of the pool: no new requests (False: it was not in it)."""


def norm(url: str) -> str:
    return url.rstrip("/")


def worker_of(doc: dict[str, Any]) -> Worker:
    """One entry of `GET /workers` (smg WorkerInfo) -> Worker."""
    return Worker(
        id=str(doc["id"]),
        url=norm(str(doc["url"])),
        status=str(doc.get("status") or (READY if doc.get("is_healthy") else "pending")),
        healthy=bool(doc.get("is_healthy")),
        load=int(doc.get("load") or 0),
    )


def worker_in_flight(url: str, *, send: Callable[..., http.Reply] = http.request) -> float | None:
    """What a server has running or queued, from its /metrics; None when unreadable."""
    try:
        reply = send("GET", f"{norm(url)}/metrics", timeout=5.0)
    except http.HttpFailure:
        return None
    text = reply.body.decode(errors="replace")
    return prometheus.in_flight(prometheus.parse_metrics(text)) if reply.status == 200 else None


def drain(
    gw: Gateway, worker: str, *, in_flight: Callable[[], float | None], timeout_s: float, pace: Pace | None = None
) -> Drained:
    """Take `worker` out of the gateway, then wait (at most `timeout_s` in all) until nothing is in flight on it.

    `in_flight` reads the worker's own count (`worker_in_flight` at a URL that reaches it).
    Safe to repeat: a worker already out is only waited on.
    """
    p = pace or Pace(interval_s=0.2)
    t0 = p.clock()
    gw.remove(worker, timeout_s=timeout_s)
    return wait_idle(worker, in_flight=in_flight, timeout_s=timeout_s, pace=p, since=t0)


def wait_idle(worker: str, *, in_flight: Callable[[], float | None], timeout_s: float, pace: Pace,
              since: float | None = None) -> Drained:
    """Until `worker`, out of the gateway, reads nothing in flight on QUIET_POLLS polls in a row (bounded)."""
    p = pace
    t0 = p.clock() if since is None else since
    quiet, last = 0, None
    while True:
        last = in_flight()
        quiet = quiet + 1 if last == 0 else 0
        elapsed = p.clock() - t0
        if quiet >= QUIET_POLLS:
            return Drained(norm(worker), True, 0.0, elapsed, "out of the gateway, nothing in flight")
        if elapsed >= timeout_s:
            left = "its /metrics unreadable" if last is None else f"{last:g} request(s) still in flight"
            return Drained(norm(worker), False, last, elapsed, f"out of the gateway, but {left} after {elapsed:.0f}s")
        p.sleep(p.interval_s)


@dataclass
class HttpGateway:
    """A running smg at `url` (http://HOST:PORT): the worker API over HTTP."""

    url: str
    send: Callable[..., http.Reply] = http.request
    pace: Pace = field(default_factory=lambda: Pace(interval_s=0.2))
    key: str | None = field(default=None, repr=False)  # the control-plane key (None: an open gateway)

    def __post_init__(self) -> None:
        self.url = norm(self.url)

    def _call(self, method: str, path: str, doc: Any = None) -> http.Reply:
        body = None if doc is None else json.dumps(doc).encode()
        headers = {} if doc is None else {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        reply = self.send(method, self.url + path, body=body, headers=headers, timeout=10.0)
        if reply.status in (401, 403):
            raise refused(self.url, f"{method} {path}", reply.status)
        return reply

    def _json(self, reply: http.Reply, what: str) -> Any:
        try:
            return reply.json()
        except ValueError:
            raise http.BadAnswer(f"gateway {self.url}: {what}: not JSON: {reply.body[:200]!r}") from None

    def workers(self) -> list[Worker]:
        reply = self._call("GET", "/workers")
        if reply.status != 200:
            raise http.BadAnswer(f"gateway {self.url}: GET /workers: HTTP {reply.status}: {reply.body[:200]!r}")
        try:
            return [worker_of(w) for w in self._json(reply, "GET /workers")["workers"]]
        except (KeyError, TypeError, ValueError):
            raise http.BadAnswer(f"gateway {self.url}: GET /workers: unexpected answer {reply.body[:200]!r}") from None

    def find(self, worker: str) -> Worker | None:
        return next((w for w in self.workers() if w.url == norm(worker)), None)

    def add(self, worker: str, *, timeout_s: float) -> Worker:
        t0 = self.pace.clock()
        w = self._settled(worker, t0, timeout_s)
        if w is not None and w.routable:
            return w
        if w is None:
            # drain_settle_secs 0: a later removal takes it out of the pool at once; `drain` does the waiting
            reply = self._call("POST", "/workers", {"url": norm(worker), "health": {"drain_settle_secs": 0}})
            if reply.status not in (202, 409):  # 409: registered meanwhile (smg worker/service.rs create_worker)
                raise http.BadAnswer(f"gateway {self.url}: POST /workers {worker}: HTTP {reply.status}: "
                                     f"{reply.body[:200]!r}")
            wid = self._json(reply, "POST /workers").get("worker_id") if reply.status == 202 else None
        else:
            wid = w.id
        return self._until_ready(worker, wid, t0, timeout_s)

    def _settled(self, worker: str, t0: float, timeout_s: float) -> Worker | None:
        """The worker as listed once no removal of it is under way (a draining entry cannot be re-added)."""
        while (w := self.find(worker)) is not None and w.status == "draining":
            self._tick(t0, timeout_s, f"{worker} is still being removed")
        return w

    def _until_ready(self, worker: str, wid: str | None, t0: float, timeout_s: float) -> Worker:
        detail = "registration queued"
        while True:
            if wid is not None:
                reply = self._call("GET", f"/workers/{wid}")
                doc = self._json(reply, f"GET /workers/{wid}") if reply.status == 200 else {}
                job = doc.get("job_status") or {}
                if job.get("status") == "failed":
                    raise InfraError(f"gateway {self.url}: adding {worker} failed: {job.get('message')}")
                detail = f"status {doc.get('status', 'not listed')}" + (f", job {job['status']}" if job else "")
                if doc.get("status") == READY:
                    return worker_of(doc)
            elif (w := self.find(worker)) is not None:
                wid = w.id
                continue
            self._tick(t0, timeout_s, f"{worker} not ready ({detail})")

    def remove(self, worker: str, *, timeout_s: float) -> bool:
        t0 = self.pace.clock()
        w = self.find(worker)
        if w is None or w.status == "draining":  # not there, or on its way out already
            return False
        reply = self._call("DELETE", f"/workers/{w.id}")
        if reply.status == 404:
            return False
        if reply.status != 202:
            raise http.BadAnswer(f"gateway {self.url}: DELETE /workers/{w.id} ({worker}): "
                                 f"HTTP {reply.status}: {reply.body[:200]!r}")
        # the removal is a queued job: done when the worker is no longer routable
        while (w := self.find(worker)) is not None and w.routable:
            self._tick(t0, timeout_s, f"{worker} still routable after DELETE")
        return True

    def _tick(self, t0: float, timeout_s: float, what: str) -> None:
        elapsed = self.pace.clock() - t0
        if elapsed >= timeout_s:
            raise InfraError(f"gateway {self.url}: {what} after {elapsed:.0f}s; check the gateway's log")
        self.pace.sleep(self.pace.interval_s)
