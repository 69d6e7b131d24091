"""When `make test`'s last xdist worker would finish, under xdist's rule and under LastTestScheduling.

The schedule is replayed on measured test durations, under xdist's own rule and under
tests/helpers_xdist.py's LastTestScheduling.

It runs the suite as `make test` runs it (every marker, every fuzz example, five workers,
`--dist loadgroup`, so under LastTestScheduling; needs the local infrastructure and ~10 minutes),
with a JUnit XML of each test's time (its setup included), then replays that run. `--junit FILE`
replays an earlier run's XML instead (from the same command with `--junitxml=FILE`).
The queue is collected here as that run collects it (tests/conftest.py's groups and order). The
real scheduler classes decide: fake workers report each test done at the measured time, and a
worker runs a test only while it holds the next one or is shutting down, as an xdist worker does
(xdist/remote.py). A test's duration is taken as measured, whatever ran beside it in the replay:
a first-order answer; run_s, the run itself, checks it against last_test_s.
A failed test still took the time it took: the replay goes on, and failed=K says how many.
Last line: `xdist_replay: tests=N sum_s=S workers=W ideal_s=I run_s=R failed=K xdist_s=X last_test_s=L`
(run_s is `-` with --junit)
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import io
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from helpers_xdist import LastTestScheduling, scheduled  # noqa: E402
from test_suite import ALL  # noqa: E402
from xdist.scheduler import LoadGroupScheduling  # noqa: E402

MARKERS = ALL[:2]


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


def run(junit: Path) -> float:
    """Seconds of the whole suite as `make test` runs it, its JUnit XML written to `junit`."""
    env = {**os.environ, "STACKBUILD_FUZZ": "full"}
    t0 = time.perf_counter()
    cp = subprocess.run([sys.executable, "-m", "pytest", *ALL, f"--junitxml={junit}"], cwd=ROOT, env=env,
                        capture_output=True, text=True)
    took = time.perf_counter() - t0
    tail = cp.stdout.strip().splitlines()[-1] if cp.stdout.strip() else cp.stderr[-500:]
    print(f"pytest {' '.join(ALL)}: {tail}", flush=True)
    # a failed test still took the time it took: the replay goes on, and its line says how many failed
    for line in cp.stdout.splitlines():
        if line.startswith(("FAILED", "ERROR")):
            print(line)
    return took


def durations(junit: Path) -> tuple[dict[str, float], int]:
    """Test node id (without `@group`) -> seconds, from JUnit's classname/name/time; and how many failed."""
    out: dict[str, float] = {}
    failed = 0
    for case in ET.parse(junit).iter("testcase"):
        failed += any(case.find(tag) is not None for tag in ("failure", "error"))
        module = case.get("classname", "").replace(".", "/") + ".py"
        name = case.get("name", "").split("@", 1)[0]
        out[f"{module}::{name}"] = out.get(f"{module}::{name}", 0.0) + float(case.get("time", "0"))
    return out, failed


def replay(kind: type[LoadGroupScheduling], ids: list[str], took: dict[str, float], workers: int) -> float:
    """When the last worker finishes, with `kind` deciding who gets what."""
    sched, nodes = scheduled(kind, ids, workers)
    running: list[int | None] = [None] * workers
    events: list[tuple[float, int]] = []
    end = 0.0

    def start(i: int, now: float) -> None:
        w = nodes[i]
        if running[i] is None and w.held and (len(w.held) >= 2 or w.shutting_down):
            running[i] = w.held.pop(0)
            heapq.heappush(events, (now + took[ids[running[i]].split("@", 1)[0]], i))

    for i in range(workers):
        start(i, 0.0)
    while events:
        now, i = heapq.heappop(events)
        end, done, running[i] = now, running[i], None
        sched.mark_test_complete(nodes[i], done)
        for j in range(workers):
            start(j, now)
    return end


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--junit", type=Path, help="replay this JUnit XML of a run as `make test` runs it")
    args = ap.parse_args()
    run_s = "-"
    if args.junit is None:
        args.junit = Path(tempfile.mkdtemp(prefix="xdist-replay-")) / "run.xml"
        run_s = f"{run(args.junit):.0f}"
    workers = int(ALL[ALL.index("-n") + 1])
    took, failed = durations(args.junit)
    ids = collect()
    missing = [i for i in ids if i.split("@", 1)[0] not in took]
    if missing:
        raise SystemExit(f"{len(missing)} collected test(s) not in {args.junit}, e.g. {missing[0]}")
    total = sum(took[i.split("@", 1)[0]] for i in ids)
    xdist_s = replay(LoadGroupScheduling, ids, took, workers)
    last_s = replay(LastTestScheduling, ids, took, workers)
    print(f"xdist_replay: tests={len(ids)} sum_s={total:.0f} workers={workers} ideal_s={total / workers:.0f} "
          f"run_s={run_s} failed={failed} xdist_s={xdist_s:.0f} last_test_s={last_s:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
