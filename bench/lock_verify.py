"""Time `stackbuild lock STACK --verify` on the real closure (cuda13: 207 wheels, 4.3 GB, 11 GB installed).

Three runs of the real command, each a subprocess:
  1. verify into a new venv: the wheels from the cache (fetched first where missing), pip's hash-checked
     install, pip check, verify_image.py, sglang's own parser on the rendered flags;
  2. the same again into that venv: reused (no install), the checks only: the loop for trying flags;
  3. a variant whose flag sglang's parser rejects (`--tp-size: eight`, which validate's flag table lets
     through: it checks names and arity, not types): exit 1, the flag named.
Prints each run's step lines with their seconds, the venv's size, and last:
`lock_verify: STACK verify_s=X install_s=Y checks_s=Z reuse_s=W rejected=FLAG exit=N`.
`--cold` empties nothing of the user's: it points the run at a fresh cache (downloads the closure again).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BAD = "  bench-bad-flag:\n    server:\n      flags:\n        --tp-size: eight\n"


def verify(root: Path, stack: str, venv: Path, env: dict[str, str], *extra: str) -> tuple[int, float, str]:
    t0 = time.perf_counter()
    cp = subprocess.run(
        [sys.executable, "-m", "stackbuild", "--root", str(root), "lock", stack, "--verify", "--venv", str(venv),
         *extra],
        cwd=root, env=env, capture_output=True, text=True,
    )  # fmt: skip
    return cp.returncode, time.perf_counter() - t0, cp.stdout + cp.stderr


def seconds(output: str, step: str) -> float:
    m = re.search(rf"^  {step}.*\((\d+) s\)$", output, re.MULTILINE)
    return float(m.group(1)) if m else float("nan")


def du(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("stack", nargs="?", default="cuda13")
    ap.add_argument("--cold", action="store_true", help="a fresh wheel cache: download the whole closure again")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory(prefix="bench-lock-verify-") as tmp:
        if args.cold:
            env["STACKBUILD_CACHE_DIR"] = f"{tmp}/cache"
        root = Path(tmp) / "project"
        shutil.copytree(ROOT / "stacks", root / "stacks")
        spec = root / "stacks" / f"{args.stack}.yaml"
        spec.write_text(spec.read_text() + ("" if "\nvariants:" in spec.read_text() else "variants:\n") + BAD)
        venv = Path(tmp) / "venv"
        rc1, t1, out1 = verify(root, args.stack, venv, env)
        print(f"--- run 1: new venv, exit {rc1}, {t1:.0f} s\n{out1}")
        size = du(venv)
        rc2, t2, out2 = verify(root, args.stack, venv, env)
        print(f"--- run 2: the same venv, exit {rc2}, {t2:.0f} s\n{out2}")
        rc3, t3, out3 = verify(root, args.stack, venv, env, "--variant", "bench-bad-flag")
        print(f"--- run 3: a flag sglang rejects, exit {rc3}, {t3:.0f} s\n{out3}")
    m = re.search(r"parser rejects (--[\w-]+)", out3)
    install = seconds(out1, "installed")
    checks = sum(seconds(out1, s) for s in ("pip check", "versions", "sglang"))
    print(f"venv: {size:.1f} GB installed")
    print(
        f"lock_verify: {args.stack} verify_s={t1:.0f} install_s={install:.0f} checks_s={checks:.0f} "
        f"reuse_s={t2:.0f} rejected={m.group(1) if m else '-'} exit={rc3}"
    )
    return 0 if (rc1, rc2, rc3) == (0, 0, 1) else 1


if __name__ == "__main__":
    sys.exit(main())
