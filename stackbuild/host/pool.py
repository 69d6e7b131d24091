"""One host's servers in the gateway's pool: put in (`join`) and taken out (`leave`: drained), by port.

The deploy flow and converge call these around every start and stop of a server that
clients reach through the gateway (smg): a server stops only once it is out of the pool
and nothing is in flight on it, and a server joins only once it serves (and, a candidate,
once it passed its gate). Each change goes to the gateway's API (effects/gateway.py) and
to the pool file its unit starts with (host/gateway.py), so a gateway restarted at any
moment starts with the pool as it should be. See docs/gateway.md, "Promotion".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

from stackbuild.effects.gateway import Drained, Gateway, wait_idle
from stackbuild.errors import InfraError
from stackbuild.host.gateway import wait_answering
from stackbuild.host.state import Slot

# port -> the server's own in-flight count reader, valid while the context is open (a tunnel, say)
Watch = Callable[[int], AbstractContextManager[Callable[[], float | None]]]
# (urls to add, urls to remove) -> the gateway unit's pool file rewritten on the gateway host
EditPool = Callable[[list[str], list[str]], None]


class DrainFailed(InfraError):
    """A server would not empty within the drain timeout: it was put back, nothing stopped (exit 4)."""


@dataclass
class GatewayLink:
    api: Gateway
    worker_url: Callable[[int], str]  # port -> the server as the gateway reaches it
    watch: Watch
    edit_pool: EditPool
    ports: Mapping[Slot, int]  # each unit's port under the spec (a release records its own)
    drain_timeout_s: float
    join_timeout_s: float
    # the gateway's unit brought up to date on its host, given the pool it starts with when it has none
    # yet; what it did (host/gateway.py ensure). None: brought up already (a rollout does it once)
    unit: Callable[[list[str]], str] | None = None
    # the caller drained the host before the deploy (a rollout): its incumbent stays out until the
    # deploy puts it back (restored) or a candidate takes its place (passed)
    kept_out: bool = False
    # the URLs of the gateway's pool file (what stackbuild put in the pool); None: not compared
    read_pool: Callable[[], list[str]] | None = None
    prune: bool = False  # workers stackbuild did not put there are removed (--prune-workers), not only named

    @property
    def url(self) -> str:
        return self.api.url

    def bring_up(self, serving: int | None, *, pool: list[str] | None = None, dry_run: bool = False) -> str:
        """The gateway's unit up to date and answering, and the server serving `serving` in its pool.
        `pool`: what a gateway started for the first time starts with (default: that server)."""
        first = pool if pool is not None else [self.worker_url(serving)] if serving else []
        said = [self.unit(first)] if self.unit is not None else []
        if dry_run:
            return "; ".join([*said, f"would put {self.worker_url(serving)} in it" if serving else ""]).strip("; ")
        workers = wait_answering(self.api, self.join_timeout_s)
        said.append(f"{self.url} answers ({len(workers)} worker(s))")
        if serving and not self.kept_out:
            said.append(self.join(serving))
        elif serving:
            said.append(f"{self.worker_url(serving)} kept out (drained by the rollout)")
        if (odd := self.strangers()) is not None:
            said.append(odd)
        return "; ".join(said)

    def strangers(self) -> str | None:
        """Workers in the gateway that its pool file does not name -- stackbuild did not put them there --
        named (a warning), and removed when `prune`; None when there are none."""
        if self.read_pool is None:
            return None
        ours = set(self.read_pool())
        odd = sorted(w.url for w in self.api.workers() if w.url not in ours)
        if not odd:
            return None
        if not self.prune:
            return (f"WARNING: the gateway routes to {len(odd)} worker(s) stackbuild did not put there: "
                    f"{', '.join(odd)}; `deploy --prune-workers` removes them")
        for url in odd:
            self.api.remove(url, timeout_s=self.join_timeout_s)
        return f"removed {len(odd)} worker(s) stackbuild did not put there (--prune-workers): {', '.join(odd)}"

    def join(self, port: int) -> str:
        """Into the pool (waits until the gateway routes to it), then into the pool file."""
        url = self.worker_url(port)
        self.api.add(url, timeout_s=self.join_timeout_s)
        self.edit_pool([url], [])
        return f"{url} in the gateway"

    def leave(self, port: int) -> Drained:
        """Out of the pool file, out of the pool, then wait until nothing is in flight on it
        (bounded). A server that was not in the pool is waited on only if it reads busy."""
        url = self.worker_url(port)
        self.edit_pool([], [url])
        with self.watch(port) as in_flight:
            was_in = self.api.remove(url, timeout_s=self.join_timeout_s)
            if not was_in and not in_flight():
                return Drained(url, True, 0.0, 0.0, "not in the gateway, nothing in flight")
            return wait_idle(url, in_flight=in_flight, timeout_s=self.drain_timeout_s, pace=self.api.pace)

    def leave_or_back(self, port: int) -> str:
        """`leave`, or when the server does not empty in time: back into the pool and DrainFailed."""
        d = self.leave(port)
        if not d.ok:
            self.join(port)
            raise DrainFailed(f"drain of {d.url} from the gateway {self.url} did not finish: {d.detail}; it was "
                              "put back and nothing was stopped (raise gateway.drain_timeout_s for longer requests)")
        return f"{d.url} drained in {d.seconds:.1f}s"
