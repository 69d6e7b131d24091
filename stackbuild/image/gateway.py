"""The gateway image's build context: its Dockerfile, its lock and the locked wheels themselves.

Every wheel is the file the lock pins for the image's python and glibc (chosen by
tag among the locked sha256s, spec/lock/wheels.py), fetched once into the wheel cache
and checked against its sha256. pip installs them inside the build with `--no-index
--require-hashes`: the build reaches no index (a TLS-intercepting proxy or an offline
build machine cannot change what goes in), and the same directory installs the
gateway into a plain venv (what the tests run).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from stackbuild.errors import InputError
from stackbuild.render.gateway import render_gateway
from stackbuild.spec.gateway_check import gateway_target, lock_command, lock_text
from stackbuild.spec.lock import resolve, wheels
from stackbuild.spec.stack import Stack


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
