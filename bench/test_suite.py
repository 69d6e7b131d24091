"""How long the test suites take: the unit suite (plain `pytest`), and with --all the whole one.

The unit suite is what `pytest` runs with no arguments (not `integration`, not `network`, on one
xdist worker per core: pyproject's addopts), timed as that (unit_s), in one process (`-n0`, unit1_s)
and on two workers as `make unit` runs it (unit2_s); issue 27 holds plain `pytest` under 30 s on two cores.
`--all` runs exactly what `make test` runs after lint
(every marker, every fuzz example, five xdist workers, `--dist loadgroup`): it needs the local
infrastructure (bash scripts/infra/up.sh) and minutes. `--load N` keeps N busy loops running
(the `stress --cpu N` of a loaded CI machine) while it measures; without it nothing is added,
and the machine's own load average is printed either way, so a figure says how busy it was.
One run each, wall time of the pytest process.
Last line: `test_suite: load=idle|busy:N cores=C unit_s=X unit1_s=X1 unit2_s=X2 passed=N`
(with --all: `all_s=Y all_passed=M` too).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALL = ["-m", "integration or not integration", "-q", "-n", "5", "--dist", "loadgroup"]


@contextmanager
def busy(n: int) -> Iterator[None]:
    """N processes that each keep a core busy for as long as the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def pytest(args: list[str], env: dict[str, str]) -> tuple[float, int]:
    """(seconds, tests passed) of one pytest run; any failure stops the bench."""
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    cp = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=ROOT, capture_output=True, text=True, env=env)
    took, load1 = time.perf_counter() - t0, os.getloadavg()[0]
    tail = cp.stdout.strip().splitlines()[-1] if cp.stdout.strip() else cp.stderr[-500:]
    if cp.returncode != 0:
        failed = "\n".join(line for line in cp.stdout.splitlines() if line.startswith(("FAILED", "ERROR")))
        raise SystemExit(f"pytest {' '.join(args)} failed (exit {cp.returncode}): {tail}\n{failed}")
    m = re.search(r"(\d+) passed", tail)
    print(f"pytest {' '.join(args)}: {tail} (load average {load0:.1f} before, {load1:.1f} after)", flush=True)
    return took, int(m.group(1)) if m else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="also the whole suite, as `make test` runs it")
    ap.add_argument("--load", type=int, default=0, metavar="N", help="N busy loops while it measures")
    args = ap.parse_args()
    env = dict(os.environ)
    # a developer's Python writes bytecode (pytest caches its rewritten test modules there)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    label = f"busy:{args.load}" if args.load else "idle"
    with busy(args.load):
        subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only"], cwd=ROOT, env=env,
                       capture_output=True)  # a warm bytecode cache, as on a second run
        unit_s, passed = pytest(["-q"], env)  # plain `pytest`: a worker per core
        unit1_s, _ = pytest(["-q", "-n0"], env)  # one process
        unit2_s, _ = pytest(["-q", "-n", "2"], env)  # `make unit`: two workers
        line = (f"test_suite: load={label} cores={os.cpu_count()} unit_s={unit_s:.1f} unit1_s={unit1_s:.1f} "
                f"unit2_s={unit2_s:.1f} passed={passed}")
        if args.all:
            all_s, all_passed = pytest(ALL, {**env, "STACKBUILD_FUZZ": "full"})
            line += f" all_s={all_s:.0f} all_passed={all_passed}"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
