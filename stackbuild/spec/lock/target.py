"""What a stack resolves for, as data: python, platform, indexes, requirements, fixed inputs (pure)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from stackbuild.spec.components import BY_NAME, dist_of
from stackbuild.spec.load import load_stack
from stackbuild.spec.stack import Stack

PYPI = "https://pypi.org/simple"


@dataclass(frozen=True)
class Distro:
    glibc: tuple[int, int]
    pythons: tuple[str, ...]  # what its own package manager installs as python3.X
    source: str


# Base image distro -> glibc and the python3.X its apt/dnf offers (the template installs python from apt).
# Sources: packages.ubuntu.com (noble: libc6 2.39, python3.12; jammy: 2.35, python3.10; focal: 2.31, 3.8),
# packages.debian.org (bookworm: libc6 2.36, python3.11).
DISTROS: dict[str, Distro] = {
    "ubuntu24.04": Distro((2, 39), ("3.12",), "packages.ubuntu.com noble: libc6 2.39, python3.12"),
    "ubuntu22.04": Distro((2, 35), ("3.10",), "packages.ubuntu.com jammy: libc6 2.35, python3.10"),
    "ubuntu20.04": Distro((2, 31), ("3.8",), "packages.ubuntu.com focal: libc6 2.31, python3.8"),
    "bookworm": Distro((2, 36), ("3.11",), "packages.debian.org bookworm: libc6 2.36, python3.11"),
}


def distro_of(base_image: str) -> str | None:
    for key in DISTROS:
        if re.search(rf"(?<![\w.]){re.escape(key)}(?![\w.])", base_image):
            return key
    return None


def platform_of(stack: Stack) -> str | None:
    """uv's --python-platform for the base image: x86_64-manylinux_<glibc> (None when unknown)."""
    if stack.lock.platform:
        return stack.lock.platform
    d = distro_of(stack.base_image)
    return f"x86_64-manylinux_{DISTROS[d].glibc[0]}_{DISTROS[d].glibc[1]}" if d else None


@dataclass(frozen=True)
class Target:
    """Everything the resolution depends on; its hash decides whether a committed lock is stale."""

    python: str
    platform: str
    requirements: tuple[str, ...]
    source_built: tuple[str, ...]  # dist==version built in the image: resolved for their deps, not emitted
    index_url: str
    extra_index_urls: tuple[str, ...]
    exclude_newer: str | None
    constraints: tuple[str, ...]
    sources: tuple[tuple[str, str, str], ...] = ()  # (dist, repo, ref) of each source build
    build_tools: tuple[str, ...] = ()  # what the source stages install first, hash-pinned apart

    def inputs_hash(self) -> str:
        d = asdict(self)
        for key in ("sources", "build_tools"):  # absent for wheel-only stacks: their locks keep their hash
            if not d[key]:
                del d[key]
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    def tools_target(self) -> Target:
        """The build tools' own resolution: same interpreter, platform, indexes, date and constraints, apart from
        the runtime closure. They are installed (--no-deps, hash-checked) in the source stages only, over the
        closure, so a tool may pin another version than the closure does (torch's build wants setuptools 75.6.0,
        sglang's closure pins 84.x): resolved together, the two could never be locked."""
        return replace(self, requirements=self.build_tools, source_built=(), sources=(), build_tools=())

    @property
    def source_dists(self) -> tuple[str, ...]:
        return tuple(r.split("==", 1)[0] for r in self.source_built)


def target_of(stack: Stack) -> Target | None:
    """None for stacks with nothing to resolve (the simulator) or an unknown base platform."""
    plat = platform_of(stack)
    comps = stack.components.items()
    if stack.server.engine != "sglang" or not comps or plat is None:
        return None
    reqs = tuple(f"{dist_of(n)}=={c.version}" for n, c in comps)
    built = tuple(f"{dist_of(n)}=={c.version}" for n, c in comps if c.source is not None)
    extra = tuple(sorted({c.index for _, c in comps if c.index and c.source is None}))
    sources = tuple((dist_of(n), c.source.repo, c.source.ref) for n, c in comps if c.source is not None)
    tools = sorted({t for n, c in comps if c.source is not None for t in BY_NAME[n].build_tools})
    return Target(
        python=stack.python,
        platform=plat,
        requirements=reqs,
        source_built=built,
        index_url=PYPI,
        extra_index_urls=extra,
        exclude_newer=stack.lock.exclude_newer,
        constraints=tuple(stack.lock.constraints),
        sources=sources,
        build_tools=tuple(tools),
    )


def own_lock(stack: Stack) -> bool:
    """Whether a variant resolves differently from its stack (and so has a lock of its own)."""
    if stack.variant is None:
        return False
    st = stack.source.stat()
    # the base image too: the lock pins it, so a variant on another base has its own lock
    return _base_target(stack.source, stack.root, st.st_mtime_ns, st.st_size) != (target_of(stack), stack.base_image)


@functools.lru_cache(maxsize=64)
def _base_target(source: Path, root: Path, _mtime_ns: int, _size: int) -> tuple[Target | None, str]:
    """The stack's own target and base image, loaded once per file version (validate asks for every variant)."""
    own = load_stack(source, root=root)
    return target_of(own), own.base_image


def lock_stem(stack: Stack) -> str:
    """NAME, or NAME.VARIANT for a variant whose closure differs (most change only server flags)."""
    return f"{stack.name}.{stack.variant}" if own_lock(stack) else stack.name


def lock_command(stack: Stack) -> str:
    return f"stackbuild lock {stack.name}" + (f" --variant {stack.variant}" if own_lock(stack) else "")


def lock_path(stack: Stack) -> Path:
    return stack.root / "stacks" / "locks" / f"{lock_stem(stack)}.txt"


def build_lock_path(stack: Stack) -> Path:
    """The hash-pinned build tools of the source stages (only for a stack with source builds)."""
    return stack.root / "stacks" / "locks" / f"{lock_stem(stack)}.build-tools.txt"


def audit_path(stack: Stack) -> Path:
    return stack.root / "stacks" / "locks" / f"{lock_stem(stack)}.audit.json"
