"""How much a rebuild costs with our stage layout vs a naive single-stage Dockerfile.

A small test stack with the shape of a real one (a slow compile stage standing in
for torch, a kernel stage, sglang, patches last) is built through the same
BuildKit path `stackbuild build` uses (stackbuild.image.buildkit), three ways: from
scratch (--no-cache), after a patch-only change, and with no change. The same
content as one naive stage that copies everything first is built the same three
ways. Figures are ratios to the full build of the same layout, from one run.

Needs the local infrastructure (bash scripts/infra/up.sh). Usage:
    python bench/rebuild.py [--slow-s 30]
Last line: rebuild: full_s=A patch_only_ratio=B noop_s=C naive_patch_only_ratio=D
"""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
import time
from pathlib import Path

from stackbuild.image import buildkit, engine

BASE = os.environ.get("STACKBUILD_BASE_IMAGE", "local/debian:bookworm")

# The slow step writes into a ccache-style cache mount, as the real source builds do.
BUILD_SH = """#!/bin/sh
set -e
echo "compiling torch (stand-in): $SLOW_S s"
sleep "$SLOW_S"
mkdir -p /opt/torch && head -c 1048576 /dev/urandom > /opt/torch/libtorch.so
date > /root/.cache/ccache/last-build
"""

STAGED = """FROM {base} AS base
RUN echo {salt} > /etc/bench-salt

FROM base AS torch
ARG SLOW_S
COPY torch-src/ /src/torch/
RUN --mount=type=cache,target=/root/.cache/ccache SLOW_S=$SLOW_S sh /src/torch/build.sh

FROM torch AS sgl-kernel
RUN sleep 2 && mkdir -p /opt/kernel && echo kernel > /opt/kernel/sgl_kernel.so

FROM torch AS deps
COPY --from=sgl-kernel /opt/kernel /opt/kernel

FROM deps AS sglang
RUN sleep 1 && mkdir -p /opt/sglang && echo 'def serve(): return 1' > /opt/sglang/server.py

FROM sglang AS runtime
COPY patches/ /opt/stackbuild/patches/
RUN cat /opt/stackbuild/patches/*.patch >> /opt/sglang/server.py
"""

# Same steps, one stage, the context copied first (what the users' hand-written file did).
NAIVE = """FROM {base}
ARG SLOW_S
COPY . /ctx/
RUN --mount=type=cache,target=/root/.cache/ccache echo {salt} > /etc/bench-salt \\
 && SLOW_S=$SLOW_S sh /ctx/torch-src/build.sh \\
 && sleep 2 && mkdir -p /opt/kernel && echo kernel > /opt/kernel/sgl_kernel.so \\
 && sleep 1 && mkdir -p /opt/sglang && echo 'def serve(): return 1' > /opt/sglang/server.py \\
 && cat /ctx/patches/*.patch >> /opt/sglang/server.py
"""


def write_context(d: Path, template: str, salt: str, patch: str) -> None:
    (d / "torch-src").mkdir(parents=True, exist_ok=True)
    (d / "patches").mkdir(exist_ok=True)
    (d / "torch-src" / "build.sh").write_text(BUILD_SH)
    (d / "Dockerfile").write_text(template.format(base=BASE, salt=salt))
    (d / "patches" / "sm120.patch").write_text(patch)


def timed_build(b: buildkit.Builder, ctx: Path, tag: str, slow_s: int, log: Path, *, no_cache: bool) -> float:
    req = buildkit.BuildRequest(context=ctx, tag=tag, build_args={"SLOW_S": str(slow_s)}, no_cache=no_cache)
    t0 = time.monotonic()
    buildkit.stream_build(buildkit.build_argv(b, req), env=b.env(os.environ), log_path=log, timeout=1800)
    return time.monotonic() - t0


def measure(name: str, template: str, b: buildkit.Builder, slow_s: int, work: Path) -> tuple[float, float, float]:
    ctx = work / name
    salt = secrets.token_hex(6)
    tag = f"stackbuild-bench:{name}-{salt}"
    write_context(ctx, template, salt, "# patch v1\n")
    full = timed_build(b, ctx, tag, slow_s, work / f"{name}-full.log", no_cache=True)
    write_context(ctx, template, salt, "# patch v2: SM120 allreduce fusion\n")
    patch = timed_build(b, ctx, tag, slow_s, work / f"{name}-patch.log", no_cache=False)
    noop = timed_build(b, ctx, tag, slow_s, work / f"{name}-noop.log", no_cache=False)
    c = engine.client()
    out = c.containers.run(tag, ["tail", "-n1", "/opt/sglang/server.py"], network_mode="none", remove=True)
    assert out.decode().strip() == "# patch v2: SM120 allreduce fusion", out  # the rebuild really took the patch
    engine.untag(c, tag)
    print(f"{name:<7} full_s={full:6.1f} patch_only_s={patch:6.1f} ({patch / full:6.1%}) "
          f"noop_s={noop:5.1f} ({noop / full:6.1%})", flush=True)  # fmt: skip
    return full, patch, noop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow-s", type=int, default=30, help="seconds of the stand-in torch compile step")
    args = ap.parse_args()
    engine.client()
    b = buildkit.find_builder()
    print(f"builder: {b.description}; slow component stage: {args.slow_s} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="stackbuild-bench-") as tmp:
        full, patch, noop = measure("staged", STAGED, b, args.slow_s, Path(tmp))
        n_full, n_patch, _ = measure("naive", NAIVE, b, args.slow_s, Path(tmp))
    print(f"rebuild: full_s={full:.1f} patch_only_ratio={patch / full:.3f} noop_s={noop:.1f} "
          f"naive_patch_only_ratio={n_patch / n_full:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
