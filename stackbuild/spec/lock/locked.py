"""What the committed lock says that a build needs: its text and digest, the source commits, torch's CUDA."""

from __future__ import annotations

import hashlib
import re

from stackbuild.spec.components import dist_of
from stackbuild.spec.lock.resolve import commits
from stackbuild.spec.lock.target import lock_path
from stackbuild.spec.stack import Stack

_RUNTIME_RE = re.compile(r"^nvidia-cuda-runtime(?:-cu\d+)?==(\d+)\.(\d+)", re.MULTILINE)


def lock_text(stack: Stack) -> str | None:
    p = lock_path(stack)
    return p.read_text(encoding="utf-8") if p.is_file() else None


def digest(stack: Stack) -> str:
    text = lock_text(stack) or ""
    return hashlib.sha256(text.encode()).hexdigest()


def source_commits(stack: Stack, text: str | None) -> dict[str, str]:
    """component -> the commit its source.ref named when the stack was locked (the lock's `# source:` lines)."""
    locked = commits(text or "")
    return {n: sha for n, c in stack.components.items()
            if c.source is not None and (sha := locked.get((dist_of(n), c.source.repo, c.source.ref)))}


def torch_cuda(stack: Stack, text: str | None) -> str:
    """What torch.version.cuda must start with: the locked CUDA runtime's major.minor, else the stack's major."""
    m = _RUNTIME_RE.search(text or "")
    if m:
        return f"{m.group(1)}.{m.group(2)}"
    return str(stack.cuda_mm[0]) if stack.cuda_mm else "none"
