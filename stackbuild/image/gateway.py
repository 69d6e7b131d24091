"""The gateway image's build context: its Dockerfile, its lock and the locked wheels themselves.

Every wheel is the file the lock pins for the image's python and glibc (chosen by
tag among the locked sha256s, spec/lock/wheels.py), fetched once into the wheel cache
and checked against its sha256. pip installs them inside the build with `--no-index
--require-hashes`: the build reaches no index (a TLS-intercepting proxy or an offline
build machine cannot change what goes in), and the same directory installs the
gateway into a plain venv (what the tests run).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from stackbuild.errors import InfraError, InputError
from stackbuild.image import buildkit, engine
from stackbuild.image import registry as reg
from stackbuild.image.ref import pin
from stackbuild.paths import cache_dir
from stackbuild.render.gateway import gateway_image_ref, render_gateway
from stackbuild.spec.lock import resolve, wheels
from stackbuild.spec.lock.smg import gateway_target, lock_command, lock_text
from stackbuild.spec.stack import Stack

BUILD_TIMEOUT_S = 3600  # apt and seven wheels, nothing compiled


def wheelhouse(stack: Stack, dest: Path) -> list[Path]:
    """Copy every locked wheel of the stack's gateway into `dest`; their paths, in lock order."""
    gw = stack.gateway
    t = gateway_target(gw) if gw else None
    text = lock_text(stack)
    if gw is None or t is None or text is None:
        raise InputError(f"{stack.source}: no gateway lock to fetch; run `{lock_command(stack)}`")
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for entry in resolve.parse(text).entries.values():
        w = wheels.locate(entry, t)
        path = dest / w.name
        if not path.is_file():
            shutil.copyfile(wheels.fetch(w), path)
        out.append(path)
    return out


def context(stack: Stack, dest: Path) -> Path:
    """The whole build context of the gateway image under `dest` (Dockerfile, requirements.lock, wheels/)."""
    for rel, text in render_gateway(stack).files.items():
        if rel.startswith("gateway/"):
            (dest / rel.removeprefix("gateway/")).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel.removeprefix("gateway/")).write_text(text, encoding="utf-8")
    wheelhouse(stack, dest / "wheels")
    return dest


def build_gateway(stack: Stack, registry: str, *, echo: Callable[[str], None], dry_run: bool = False) -> str:
    """The gateway image in `registry` (built with BuildKit from `context` and pushed unless the registry
    has it already: its tag is the hash of its Dockerfile and lock), pinned by digest."""
    ref = gateway_image_ref(stack, render_gateway(stack).content_hash, registry)
    if dry_run:
        echo(f"would build and push the gateway image {ref} unless the registry has it, then run it by digest")
        return pin(ref, "sha256:" + "0" * 64)
    try:
        have = reg.manifest_digest(reg.parse_ref(ref))
    except InfraError:
        have = None
    if have:
        return pin(ref, have)
    with tempfile.TemporaryDirectory(prefix="stackbuild-gateway-") as tmp:
        ctx = context(stack, Path(tmp) / "context")
        builder = buildkit.find_builder()
        log = cache_dir() / "logs" / f"gateway-{ref.rsplit('-', 1)[-1]}-{time.strftime('%Y%m%dT%H%M%S')}.log"
        echo(f"building the gateway image {ref} with {builder.description}; log: {log}")
        request = buildkit.BuildRequest(context=ctx, tag=ref)
        buildkit.stream_build(buildkit.build_argv(builder, request), env=builder.env(os.environ), log_path=log,
                              timeout=BUILD_TIMEOUT_S)
    digest = engine.push(engine.client(), ref)
    echo(f"pushed the gateway image {ref} ({digest})")
    return pin(ref, digest)
