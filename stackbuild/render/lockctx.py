"""What the Dockerfile takes beyond the spec: template values from the lock and the component table, and the
build context's files that are not rendered (the lock, the source stages' build tools, the in-image scripts)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stackbuild.paths import templates_dir
from stackbuild.spec.components import BY_NAME, aot_arches
from stackbuild.spec.lock.base import digest_of, pinned_reference
from stackbuild.spec.lock.base import parse as parse_base
from stackbuild.spec.lock.locked import lock_text, source_commits, torch_cuda
from stackbuild.spec.lock.source import is_commit
from stackbuild.spec.lock.target import build_lock_path, lock_command
from stackbuild.spec.stack import Stack


@dataclass(frozen=True)
class AotBuild:
    """A component's AOT build that the stack asks for: its stage, driver script and where its modules land."""

    component: str
    arches: str  # as its driver reads them: space-separated
    dir: str
    script: str
    label: str


def aot_builds(stack: Stack) -> dict[str, AotBuild]:
    """component -> its AOT build, for each component whose entry has one and whose spec names arches."""
    out = {}
    for name, c in stack.components.items():
        hook = BY_NAME[name].aot
        if hook is not None and (arches := aot_arches(c)):
            out[name] = AotBuild(name, " ".join(arches), hook.dir_for(stack.python), hook.script, hook.label)
    return out


def context(stack: Stack) -> dict[str, Any]:
    text = lock_text(stack)
    builds = [(n, c, BY_NAME[n]) for n, c in stack.components.items() if c.source is not None]
    return {
        "aot": aot_builds(stack),
        "source_builds": builds,
        # the component whose built wheel the other source stages build against (torch)
        "build_base": next((n for n, _, e in builds if e.build_base), None),
        "source_commit": source_commits(stack, text),
        # full commit ids: fetched by id, since `git clone --branch` takes only branches and tags
        "source_by_commit": {n for n, c, _ in builds if c.source is not None and is_commit(c.source.ref)},
        "torch_cuda": torch_cuda(stack, text),
        **base_context(stack, text),
    }


def base_context(stack: Stack, text: str | None) -> dict[str, Any]:
    """FROM's reference (the spec's base, with the digest the lock pinned for it) and that digest, for the label."""
    from_ref = pinned_reference(stack.base_image, parse_base(text or ""))
    return {"base_from": from_ref, "base_digest": digest_of(from_ref)}


def verify_script() -> str:
    """templates/verify_image.py: what the image (and `lock --verify`'s venv) runs to check the lock's versions."""
    return (templates_dir() / "verify_image.py").read_text(encoding="utf-8")


def files(stack: Stack) -> dict[str, str]:
    """requirements.lock (the committed lock, or a line saying none was made), the source stages' hash-pinned
    build tools, the image's verifier, the AOT drivers."""
    missing = f"# no lock: run `{lock_command(stack)}`\n"
    out = {"requirements.lock": lock_text(stack) or missing, "verify_image.py": verify_script()}
    if any(c.source is not None for _, c in stack.components.items()):
        tools = build_lock_path(stack)
        out["build-tools.lock"] = tools.read_text(encoding="utf-8") if tools.is_file() else missing
    for b in aot_builds(stack).values():
        out[b.script] = (templates_dir() / b.script).read_text(encoding="utf-8")
    return out
