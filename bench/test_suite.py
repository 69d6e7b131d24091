"""How long the test suites take: the unit suite (plain `pytest`), and with --all the whole one.

The unit suite is what `pytest` runs with no arguments (not `integration`, not `network`);
issue 21 holds it under 30 s. `--all` runs exactly what `make test` runs after lint (every
marker, five xdist workers, `--dist loadgroup`): it needs the local infrastructure
(bash scripts/infra/up.sh) and minutes. One run each, wall time of the pytest process.
Last line: `test_suite: unit_s=X passed=N` (with --all: `all_s=Y all_passed=M` too).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALL = ["-m", "integration or not integration", "-q", "-n", "5", "--dist", "loadgroup"]


def pytest(args: list[str]) -> tuple[float, int]:
    """(seconds, tests passed) of one pytest run; any failure stops the bench."""
    t0 = time.perf_counter()
    cp = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - t0
    tail = cp.stdout.strip().splitlines()[-1] if cp.stdout.strip() else cp.stderr[-500:]
    if cp.returncode != 0:
        raise SystemExit(f"pytest {' '.join(args)} failed (exit {cp.returncode}): {tail}")
    m = re.search(r"(\d+) passed", tail)
    print(f"pytest {' '.join(args)}: {tail}", flush=True)
    return took, int(m.group(1)) if m else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="also the whole suite, as `make test` runs it")
    args = ap.parse_args()
    unit_s, passed = pytest(["-q"])
    line = f"test_suite: unit_s={unit_s:.1f} passed={passed}"
    if args.all:
        all_s, all_passed = pytest(ALL)
        line += f" all_s={all_s:.0f} all_passed={all_passed}"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
