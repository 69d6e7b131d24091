"""Where things are: stacks and templates (--root, the nearest parent with stacks/, or the
package) and the one user cache directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from platformdirs import user_cache_dir

_PKG = Path(__file__).resolve().parent


def shipped_dir(kind: str) -> Path:
    """`stacks` or `templates`: the repo's copy in a checkout, else the wheel's package data."""
    repo = _PKG.parent / kind
    if (_PKG.parent / "pyproject.toml").is_file() and repo.is_dir():
        return repo
    return _PKG / "_shipped" / kind


def cache_dir() -> Path:
    """$STACKBUILD_CACHE_DIR, else the platform's user cache dir (honours $XDG_CACHE_HOME)."""
    env = os.environ.get("STACKBUILD_CACHE_DIR")
    if env:
        return Path(env)
    return Path(user_cache_dir("stackbuild"))


def templates_dir() -> Path:
    return shipped_dir("templates")


def stack_root(root: Path | None = None, cwd: Path | None = None) -> Path:
    """The project root whose stacks/ we use."""
    if root is not None:
        return root.resolve()
    here = (cwd or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "stacks").is_dir():
            return d
    return shipped_dir("stacks").parent


def stack_dirs(root: Path | None = None) -> list[Path]:
    return [stack_root(root) / "stacks"]


@dataclass(frozen=True)
class StackRef:
    name: str
    path: Path
    root: Path  # the project root: patches resolve against root/stacks

    @property
    def display(self) -> str:
        cwd = Path.cwd().resolve()
        return os.path.relpath(self.path, cwd) if self.path.is_relative_to(cwd) else str(self.path)


def _ref_for_file(path: Path) -> StackRef:
    path = path.resolve()
    root = path.parent.parent if path.parent.name == "stacks" else path.parent
    return StackRef(path.stem, path, root)


def find_stack(name: str, *, near: Path | None = None, root: Path | None = None) -> StackRef | None:
    candidates: list[Path] = []
    p = Path(name)
    if p.suffix in (".yaml", ".yml") or "/" in name:
        candidates.append(p if p.is_absolute() or near is None else near / p)
        candidates.append(p)
    else:
        if near is not None:
            candidates += [near / f"{name}.yaml", near / f"{name}.yml"]
        for d in stack_dirs(root):
            candidates += [d / f"{name}.yaml", d / f"{name}.yml"]
    for c in candidates:
        if c.is_file():
            ref = _ref_for_file(c)
            if root is not None and c.resolve().is_relative_to(stack_root(root)):
                ref = StackRef(ref.name, ref.path, stack_root(root))
            return ref
    return None


def list_stacks(root: Path | None = None) -> list[StackRef]:
    """Stacks users can name; files starting with '_' are parents only."""
    out: list[StackRef] = []
    for d in stack_dirs(root):
        if d.is_dir():
            out += [_ref_for_file(p) for p in sorted(d.glob("*.y*ml")) if not p.name.startswith("_")]
    return out
