"""What rendering needs from the lock: template values, files for the build context, the lock's digest."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from stackbuild.paths import templates_dir
from stackbuild.spec.lock.resolve import commits
from stackbuild.spec.lock.target import DIST, build_lock_path, lock_command, lock_path
from stackbuild.spec.stack import Stack

SOURCE_SUBDIR = {"sgl_kernel": "/sgl-kernel"}
_RUNTIME_RE = re.compile(r"^nvidia-cuda-runtime(?:-cu\d+)?==(\d+)\.(\d+)", re.MULTILINE)


def lock_text(stack: Stack) -> str | None:
    p = lock_path(stack)
    return p.read_text(encoding="utf-8") if p.is_file() else None


def source_commits(stack: Stack, text: str | None) -> dict[str, str]:
    """component -> the commit its source.ref named when the stack was locked (the lock's `# source:` lines)."""
    locked = commits(text or "")
    return {n: sha for n, c in stack.components.items()
            if c.source is not None and (sha := locked.get((DIST[n], c.source.repo, c.source.ref)))}


def torch_cuda(stack: Stack, text: str | None) -> str:
    """What torch.version.cuda must start with: the locked CUDA runtime's major.minor, else the stack's major."""
    m = _RUNTIME_RE.search(text or "")
    if m:
        return f"{m.group(1)}.{m.group(2)}"
    return str(stack.cuda_mm[0]) if stack.cuda_mm else "none"


def aot_dir(stack: Stack) -> str:
    """Where the installed flashinfer loads AOT modules from: <package>/data/aot (flashinfer 0.7.2 jit/env.py:238)."""
    return f"/opt/venv/lib/python{stack.python}/site-packages/flashinfer/data/aot"


def flashinfer_aot(stack: Stack) -> dict[str, str] | None:
    c = stack.components.flashinfer
    if c is None or c.aot is None:
        return None
    return {"arches": " ".join(c.aot.arches), "dir": aot_dir(stack)}


def context(stack: Stack) -> dict[str, Any]:
    text = lock_text(stack)
    builds = [(n, c) for n, c in stack.components.items() if c.source is not None]
    return {
        "flashinfer_aot": flashinfer_aot(stack),
        "source_builds": builds,
        "source_commit": source_commits(stack, text),
        "source_subdir": {n: SOURCE_SUBDIR.get(n, "") for n, _ in builds},
        "torch_cuda": torch_cuda(stack, text),
    }


def files(stack: Stack) -> dict[str, str]:
    """requirements.lock (the committed lock, or a line saying none was made), the source stages' hash-pinned
    build tools, the image's verifier, the AOT driver."""
    missing = f"# no lock: run `{lock_command(stack)}`\n"
    verify = (templates_dir() / "verify_image.py").read_text(encoding="utf-8")
    out = {"requirements.lock": lock_text(stack) or missing, "verify_image.py": verify}
    if any(c.source is not None for _, c in stack.components.items()):
        tools = build_lock_path(stack)
        out["build-tools.lock"] = tools.read_text(encoding="utf-8") if tools.is_file() else missing
    if flashinfer_aot(stack):
        out["flashinfer_aot.py"] = (templates_dir() / "flashinfer_aot.py").read_text(encoding="utf-8")
    return out


def digest(stack: Stack) -> str:
    text = lock_text(stack) or ""
    return hashlib.sha256(text.encode()).hexdigest()

