"""How long `stackbuild --help`, and `validate` and `render` of every shipped stack take, cache warm.

Runs the real console script in fresh processes (import time included), takes
the median of several runs, and reports what the CLI imported: docker, fabric
and aiohttp must stay out of these commands.
Last line: `cli: help_s=X validate_all_s=Y render_all_s=Z`.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = 5


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> int:
    exe = shutil.which("stackbuild")
    base = [exe] if exe else [sys.executable, "-m", "stackbuild"]
    stacks = sorted(p.stem for p in (ROOT / "stacks").glob("*.yaml") if not p.name.startswith("_"))
    subprocess.run([*base, "validate"], cwd=ROOT, check=True, capture_output=True)  # warm the flag cache
    help_s = statistics.median(timed([*base, "--help"]) for _ in range(RUNS))
    validate = statistics.median(timed([*base, "validate", "--offline"]) for _ in range(RUNS))
    with tempfile.TemporaryDirectory() as out:

        def render_all() -> float:
            return sum(timed([*base, "render", s, "--offline", "--out", f"{out}/{s}"]) for s in stacks)

        render = statistics.median(render_all() for _ in range(RUNS))
    probe = (
        "import sys, stackbuild.cli.main as c; c.main(['validate', '--offline']); "
        "print(','.join(m for m in ('docker', 'fabric', 'aiohttp', 'paramiko', 'matplotlib') if m in sys.modules))"
    )
    lines = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True).stdout.splitlines()
    heavy = lines[-1] if lines and not lines[-1].startswith("ok:") else ""
    print(f"stacks: {', '.join(stacks)} (validate checks every variant)")
    print(f"heavy modules imported by validate: {heavy or 'none'}")
    print(f"cli: help_s={help_s:.3f} validate_all_s={validate:.3f} render_all_s={render:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
