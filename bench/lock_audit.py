"""Lock and audit time for the shipped GPU stacks, cold (empty caches) and warm, plus warm validate.

Cold: a fresh stackbuild cache (wheels, audits) and a fresh uv cache, so every
native wheel of both closures is downloaded and read (several GB). Warm: the
same again with those caches filled. Both lock a copy of stacks/ without its
committed audits (`lock` takes a committed audit of the same file as read), and
write to a temp dir, never over the committed files. `--warm-only` skips the cold pass.
Last line: `lock_audit: cold_s=X warm_s=Y validate_all_s=Z` (per stack above it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STACKS = ("cuda12.8", "cuda13")


def lock_once(stack: str, out: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "stackbuild", "--root", str(out.parent), "lock", stack,
         "--out", str(out / f"{stack}.txt")],
        cwd=out.parent,
        env=env,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


def validate_all(env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "stackbuild", "validate", "--offline"],
        cwd=ROOT, env=env, check=True, capture_output=True,
    )
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm-only", action="store_true", help="use the user's caches as they are; no cold pass")
    args = ap.parse_args()
    user = {**os.environ, "PYTHONPATH": str(ROOT)}
    env = user
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(ROOT / "stacks", Path(tmp) / "stacks", ignore=shutil.ignore_patterns("*.audit.json"))
        out = Path(tmp) / "locks"
        out.mkdir()
        if not args.warm_only:
            env = {**env, "STACKBUILD_CACHE_DIR": f"{tmp}/sb-cache", "UV_CACHE_DIR": f"{tmp}/uv-cache"}
        cold = {s: lock_once(s, out, env) for s in STACKS} if not args.warm_only else {}
        warm = {s: lock_once(s, out, env) for s in STACKS}
        for s in STACKS:
            print(f"{s}: lock+audit cold_s={cold.get(s, float('nan')):.1f} warm_s={warm[s]:.1f}")
        v = min(validate_all(user) for _ in range(3))  # the user's caches: sglang's flag tables
    print(f"lock_audit: cold_s={sum(cold.values()):.1f} warm_s={sum(warm.values()):.1f} validate_all_s={v:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
