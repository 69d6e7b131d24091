"""Replay `make test`'s pytest-xdist schedule on measured test durations, under xdist's own rule and
under tests/helpers_xdist.py's LastTestScheduling: when would the last worker finish?

Input: a JUnit XML of a run as `make test` runs it (each test's time, its setup included), e.g.
  STACKBUILD_FUZZ=full python3 -m pytest -m "integration or not integration" -q -n 5 \
      --dist loadgroup --junitxml=/tmp/run.xml
The queue is collected here as that run collects it (tests/conftest.py's groups and order). The
real scheduler classes decide: fake workers report each test done at the measured time, and a
worker runs a test only while it holds the next one or is shutting down, as an xdist worker does
(xdist/remote.py). A test's duration is taken as measured, whatever ran beside it in the replay:
a first-order answer, which the real run under the new rule then checks.
Last line: `xdist_replay: tests=N sum_s=S workers=W ideal_s=I xdist_s=X last_test_s=L`
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import io
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from helpers_xdist import LastTestScheduling  # noqa: E402
from xdist.scheduler import LoadGroupScheduling  # noqa: E402

MARKERS = ["-m", "integration or not integration"]


class Collected:
    """Each test's xdist node id (`@group` where tests/conftest.py grouped it), in the order collected."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            group = item.get_closest_marker("xdist_group")
            self.ids.append(f"{item.nodeid}@{group.args[0]}" if group else item.nodeid)


def collect() -> list[str]:
    plugin = Collected()
    with contextlib.redirect_stdout(io.StringIO()):  # its list of tests: not this script's output
        code = pytest.main([*MARKERS, "-q", "-n0", "--collect-only", "-p", "no:randomly", str(ROOT / "tests")],
                           plugins=[plugin])
    if code != 0:
        raise SystemExit(f"collection failed (exit {code})")
    return plugin.ids


def durations(junit: Path) -> dict[str, float]:
    """Test node id (without `@group`) -> seconds, from JUnit's classname/name/time."""
    out: dict[str, float] = {}
    for case in ET.parse(junit).iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        name = case.get("name", "").split("@", 1)[0]
        out[f"{module}::{name}"] = out.get(f"{module}::{name}", 0.0) + float(case.get("time", "0"))
    return out


class Worker:
    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.held: list[int] = []
        self.running: int | None = None

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.held.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def replay(kind: type[LoadGroupScheduling], ids: list[str], took: dict[str, float], workers: int) -> float:
    """When the last worker finishes, with `kind` deciding who gets what."""
    config: Any = SimpleNamespace(getvalue=lambda name: {"tx": [f"{workers}*popen"]}[name],
                                  option=SimpleNamespace(loadscopereorder=True))
    quiet = SimpleNamespace(loadscopesched=lambda *_: None, loadgroupsched=lambda *_: None)
    sched = kind(config, quiet)
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for n in nodes:
        sched.add_node(n)
        sched.add_node_collection(n, ids)
    sched.schedule()
    events: list[tuple[float, int]] = []
    end = 0.0

    def start(i: int, now: float) -> None:
        w = nodes[i]
        if w.running is None and w.held and (len(w.held) >= 2 or w.shutting_down):
            w.running = w.held.pop(0)
            heapq.heappush(events, (now + took.get(ids[w.running].split("@", 1)[0], 0.0), i))

    for i in range(workers):
        start(i, 0.0)
    while events:
        now, i = heapq.heappop(events)
        w, end = nodes[i], now
        done, w.running = w.running, None
        sched.mark_test_complete(w, done)
        for j in range(workers):
            start(j, now)
    return end


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", type=Path, help="JUnit XML of a run as `make test` runs it")
    ap.add_argument("--workers", type=int, default=5)
    args = ap.parse_args()
    took = durations(args.junit)
    ids = collect()
    missing = [i for i in ids if i.split("@", 1)[0] not in took]
    if missing:
        raise SystemExit(f"{len(missing)} collected test(s) not in {args.junit}, e.g. {missing[0]}")
    total = sum(took[i.split("@", 1)[0]] for i in ids)
    xdist_s = replay(LoadGroupScheduling, ids, took, args.workers)
    last_s = replay(LastTestScheduling, ids, took, args.workers)
    print(f"xdist_replay: tests={len(ids)} sum_s={total:.0f} workers={args.workers} ideal_s={total / args.workers:.0f} "
          f"xdist_s={xdist_s:.0f} last_test_s={last_s:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
