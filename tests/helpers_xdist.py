"""How `make test` hands its tests to the pytest-xdist workers (`--dist loadgroup`): the order of
the queue (`apart`) and when a worker gets its next scope (`LastTestScheduling`).

A scope is a module (its tests share a host or a project) or, where a module sets
`PER_TEST = True`, one test. A worker runs a test only once it holds the next one, or is told
to shut down (pytest needs the next item to tear fixtures down): a worker with one pending
test is waiting for work.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling

# The most tests a worker holds: the one it runs and the next. It is handed its next scope once it
# holds fewer, i.e. when it starts the last test of what it has.
HELD = 2


class LastTestScheduling(LoadGroupScheduling):
    """`--dist loadgroup`, but a worker is handed its next scope only when it starts the last test it
    holds, where xdist hands it one as soon as it holds two or fewer (xdist 3.8,
    scheduler/loadscope.py: `_reschedule`, "Heuristic of minimum tests to enqueue more work").

    With xdist's rule a worker took a demo (~200 s) while two of the fleet module's ~75 s tests were
    still ahead of it, and ran the demo at the end while three workers had been idle for up to 165 s
    (2026-12-07, this 2-core machine: pytest 559 s, its longest worker 558 s and its shortest 392 s).
    Replayed on that run's test durations (xdist's queue and rule, per-test times as measured),
    this rule ends it at 482 s; a perfect split of the same 2246 s of tests over five workers, 450 s.
    """

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) < HELD:
            self._assign_work_unit(node)


class Worker:
    """What an xdist scheduler sees of a worker, driven by hand: tests/test_scheduling.py and the replay in
    bench/xdist_replay.py. `sent`: each batch of collection indexes it was handed; `held`: those not yet
    taken off by whoever plays the worker."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[list[int]] = []
        self.held: list[int] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(list(indexes))
        self.held.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def scheduled(kind: type[LoadGroupScheduling], collection: list[str], workers: int) -> tuple[Any, list[Worker]]:
    """A scheduler of `kind` over `workers` Workers that all collected `collection` (xdist node ids,
    `@group` where grouped), its first hand-out made."""
    config = SimpleNamespace(getvalue=lambda name: {"tx": [f"{workers}*popen"]}[name],
                             option=SimpleNamespace(loadscopereorder=True))
    quiet = SimpleNamespace(loadscopesched=lambda *_: None, loadgroupsched=lambda *_: None)
    sched = kind(config, quiet)
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for n in nodes:
        sched.add_node(n)
        sched.add_node_collection(n, collection)
    sched.schedule()
    return sched, nodes


def module_says(item: pytest.Item, name: str) -> bool:
    """Whether the test's module sets `name` (PER_TEST, APART) to a true value."""
    return bool(getattr(getattr(item, "module", None), name, False))


def apart(items: list[pytest.Item]) -> list[pytest.Item]:
    """The tests of a module that sets `APART = True` (the two demos, ~200 s each) first among
    the one-test scopes, HELD - 1 short one-test scopes between each two of them, so that the
    worker that takes one cannot also hold the next.

    xdist sorts scopes by their number of tests, keeping the collection order among equals. Two
    such tests next to each other in the queue ran on one worker, one after the other, 433 s at the
    end of a fresh-clone CI while the other four workers had finished 229-302 s earlier
    (2026-12-07, 750 s of pytest)."""
    long = [i for i in items if module_says(i, "APART")]
    short = iter([i for i in items if module_says(i, "PER_TEST") and not module_says(i, "APART")])
    front: list[pytest.Item] = []
    for n, item in enumerate(long):
        front.append(item)
        if n < len(long) - 1:
            front += itertools.islice(short, HELD - 1)
    placed = {id(i) for i in front}
    return front + [i for i in items if id(i) not in placed]
