"""`build_stack`: render, assemble the context, build with BuildKit, smoke-test, tag, push.

The image is built under a temporary tag and gets its real REPO:LABEL-HASH12 tag
only after the smoke test passes, so a failed build leaves no half-tagged image.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackbuild.errors import InfraError, InputError
from stackbuild.image import buildkit, context, engine
from stackbuild.image import registry as reg
from stackbuild.image.ref import distribution, pin
from stackbuild.image.smoke import smoke_test
from stackbuild.paths import cache_dir
from stackbuild.render.stack import image_ref
from stackbuild.spec.load import load_stack, positions
from stackbuild.spec.lock.base import LOCAL_PREFIX, agrees, digest_of
from stackbuild.spec.lock.base import parse as parse_base
from stackbuild.spec.lock.locked import lock_text
from stackbuild.spec.lock.target import lock_command
from stackbuild.spec.stack import Stack

Echo = Callable[[str], None]
BUILD_TIMEOUT_S = 6 * 3600  # a torch source build takes hours
BASE_ID_LABEL = "dev.stackbuild.base.id"  # the local base's image id the image was built on


@dataclass(frozen=True)
class BuildResult:
    image: str  # REPO:LABEL-HASH12
    tag: str  # LABEL-HASH12
    hash: str  # full content hash
    image_id: str | None  # local config digest (None when only the registry has it)
    digest: str | None  # registry manifest digest, when pushed or found there
    skipped: bool
    log_path: str | None = None
    lock: dict[str, Any] = field(default_factory=dict)  # stack.lock.json of the image

    @property
    def repo_digest(self) -> str | None:
        return pin(self.image, self.digest) if self.digest else None


@dataclass(frozen=True)
class Plan:
    stack: Stack
    repo: str
    registry: str | None  # HOST:PORT/REPO when the image goes to / comes from a registry
    ref: str
    hash: str
    lock: dict[str, Any]
    request: buildkit.BuildRequest
    builder: buildkit.Builder
    ctx: context.Context
    display: str  # "tty": a progress bar per stage; "plain": BuildKit's lines; "stages": a line per stage built
    local_base: dict[str, Any] | None = None  # a `local/` base as the daemon had it when the build began

    @property
    def argv(self) -> list[str]:
        return buildkit.build_argv(self.builder, self.request)


def _echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build_stack(
    stack: Stack | str,
    *,
    registry: str | None = None,
    push: bool = False,
    no_cache: bool = False,
    dry_run: bool = False,
    root: Path | None = None,
    variant: str | None = None,
    echo: Echo = _echo,
    progress: str | None = None,
) -> BuildResult:
    """Build (or find) the stack's image; with push, make sure the registry has it too."""
    if isinstance(stack, str):
        stack = load_stack(stack, root=root, variant=variant)
    target = registry or stack.host.registry
    if target:
        reg.parse_registry(target)
    if push and not target:
        raise InputError(f"{stack.source}: --push needs --registry HOST:PORT/REPO (or host.registry in the spec)")
    c = _client_or_none() if dry_run else engine.client()
    if target and push:
        reg.ping(target.split("/", 1)[0])  # fail before hours of building, not after
    elif target and not dry_run:
        _ping_soft(target, echo)
    if dry_run:  # the context stays on disk, for reading
        keep = cache_dir() / "contexts"
        keep.mkdir(parents=True, exist_ok=True)
        plan = _plan(
            stack,
            target,
            Path(tempfile.mkdtemp(prefix=f"{stack.label}-", dir=keep)),
            c,
            no_cache=no_cache,
            progress=progress,
            push=push,
            dry_run=True,
            echo=echo,
        )
        _print_dry_run(plan, echo, daemon=c is not None)
        return BuildResult(plan.ref, plan.ref.rsplit(":", 1)[1], plan.hash, None, None, skipped=True, lock=plan.lock)
    with tempfile.TemporaryDirectory(prefix="stackbuild-ctx-") as tmp:
        plan = _plan(stack, target, Path(tmp), c, no_cache=no_cache, progress=progress, push=push, echo=echo)
        with _lock(plan.hash[:16]):
            return _execute(plan, c, push=push, echo=echo)


def _client_or_none() -> Any:
    try:
        return engine.client()
    except InfraError:
        return None


def _ping_soft(target: str, echo: Echo) -> None:
    try:
        reg.ping(target.split("/", 1)[0])
    except InfraError as err:
        echo(f"note: {err}; building without the registry's cache")


def _plan(
    stack: Stack,
    target: str | None,
    tmp: Path,
    c: Any,
    *,
    no_cache: bool,
    progress: str | None,
    push: bool,
    dry_run: bool = False,
    echo: Echo = _echo,
) -> Plan:
    rendered = context.rendered_for_image(stack)
    ctx = context.assemble(rendered.files, tmp / "context", python=stack.python)
    local_base = _local_base(c, stack)
    if not dry_run:
        check_locked_base(stack, echo=echo)
    digest = rendered.content_hash
    repo = target or "stackbuild"
    ref = image_ref(stack, digest, repo)
    dockerfile = rendered.files["Dockerfile"]
    build_args = context.build_args(dockerfile, stack, *context.machine())
    builder = buildkit.find_builder()
    cache_ref = f"{target}:buildcache-{stack.label}" if target else None
    request = buildkit.BuildRequest(
        context=ctx.dir,
        tag=f"{ref}-partial{os.getpid()}",
        # the Dockerfile's own LABELs carry the hash and the lock; a local base's id is known only here
        labels={BASE_ID_LABEL: local_base["Id"]} if local_base else {},
        build_args=build_args,
        secrets=_secret_files(stack, tmp / "secrets", write=not dry_run),
        cache_from=(cache_ref,) if cache_ref and not no_cache and _exists(cache_ref) else (),
        cache_to=cache_ref if push and cache_ref else None,
        no_cache=no_cache,
        progress="plain",  # always plain for the CLI: we parse it, and draw bars ourselves on a tty
        iidfile=tmp / "iid",
    )
    display = progress or ("tty" if sys.stderr.isatty() else "plain")
    return Plan(stack, repo, target, ref, digest, rendered.lock, request, builder, ctx, display, local_base)


def _local_base(c: Any, stack: Stack) -> dict[str, Any] | None:
    """A `local/` base (made on this machine, in no registry) as the daemon has it now: its id pins it.

    FROM cannot carry that pin: BuildKit reads `NAME@sha256:D` as a registry manifest digest, and an image
    made by `docker import` has none (its RepoDigests are empty; its Id is the digest of its config, which
    lists its layers). So the build records the id it starts from and checks the image it made is built on it.
    """
    if c is None or not stack.base_image.startswith(LOCAL_PREFIX):
        return None
    attrs = engine.image_attrs(c, stack.base_image)
    if attrs is None:
        raise InfraError(f"base image {stack.base_image} is absent; make it with: bash scripts/infra/up.sh")
    return attrs


def check_locked_base(
    stack: Stack, *, echo: Echo, tag_digest: Callable[[str, str, str], str | None] = reg.tag_digest
) -> str | None:
    """Before building FROM the digest the lock pinned, ask the registry whether the spec's tag still names it:
    a tag moved since `lock` is refused (the user relocks to take the new base, or pins the old one in the
    spec); a registry that does not answer is a note, since FROM builds the locked digest all the same.
    Returns the digest FROM carries (None when the base is unpinned or the spec pins it itself)."""
    if digest_of(stack.base_image) is not None:
        return None
    locked = parse_base(lock_text(stack) or "")
    if locked is None or locked.digest is None or not agrees(locked, stack.base_image):
        return None
    host, repo, tag, _ = distribution(stack.base_image)
    try:
        now = tag_digest(host, repo, tag)
    except (reg.Unreachable, reg.NoDigest) as err:
        echo(f"note: cannot check that {stack.base_image} still names the locked {locked.digest} ({err}); "
             "building the locked digest")
        return locked.digest
    if now != locked.digest:
        named_now = f"names {now}" if now else "is gone from its registry"
        at = positions(stack).pos(("base_image",))
        raise InputError(
            f"{at.file}:{at.line}:{at.col}: base image {stack.base_image} {named_now}, but the lock pins "
            f"{locked.digest}: run `{lock_command(stack)}` to take the new base, or keep the locked one with "
            f"base_image: {stack.base_image}@{locked.digest}"
        )
    return locked.digest


def verify_local_base(c: Any, image_id: str, base: dict[str, Any]) -> None:
    """The image just built sits on the local base the build started from: its layers begin with the base's."""
    built = engine.image_attrs(c, image_id) or {}
    have = list((built.get("RootFS") or {}).get("Layers") or [])
    want = list((base.get("RootFS") or {}).get("Layers") or [])
    if not want or have[: len(want)] != want:
        raise InfraError(
            f"the image built ({image_id}) is not built on the local base {base['Id']} this build started from "
            "(was the base re-made during the build?); build again"
        )


def _exists(ref: str) -> bool:
    try:
        return reg.manifest_digest(reg.parse_ref(ref)) is not None
    except InfraError:
        return False


def _secret_files(stack: Stack, d: Path, *, write: bool = True) -> dict[str, Path]:
    """BuildKit secrets from the environment (id hf_token <- $HF_TOKEN); files only this user reads.

    A dry run (write=False) names the files the command would use but writes no value: its
    context is kept on disk for reading, and a secret must not outlive the command.
    """
    out: dict[str, Path] = {}
    for sid in stack.build.secrets:
        value = os.environ.get(sid.upper())
        if not value:
            continue
        p = d / sid
        out[sid] = p
        if not write:
            continue
        d.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value)
    return out


def _print_dry_run(plan: Plan, echo: Echo, *, daemon: bool) -> None:
    echo(f"builder: {plan.builder.description}")
    echo(f"image: {plan.ref}" + ("" if daemon else " (docker daemon not reachable)"))
    echo("command: DOCKER_BUILDKIT=1 " + shlex.join(plan.argv))
    echo(f"context ({plan.ctx.dir}):")
    for rel in sorted(plan.ctx.digests):
        size = (plan.ctx.dir / rel).stat().st_size
        echo(f"  {rel}  {size} bytes")


@contextmanager
def _lock(name: str) -> Iterator[None]:
    """One process of this machine at a time holds `name` (flock on a file in the cache's locks/)."""
    d = cache_dir() / "locks"
    d.mkdir(parents=True, exist_ok=True)
    with (d / f"{name}.lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _execute(plan: Plan, c: Any, *, push: bool, echo: Echo) -> BuildResult:
    tag = plan.ref.rsplit(":", 1)[1]
    local = engine.image_attrs(c, plan.ref)
    stale_base = _built_on_other_base(local, plan.local_base)
    if stale_base:
        echo(stale_base)
    elif local is not None and engine.labels_of(local).get("dev.stackbuild.hash") == plan.hash:
        echo(f"skipped: {plan.ref} already exists locally (same content hash)")
        digest = _ensure_pushed(plan, c, echo) if push else _registry_digest(plan)
        return BuildResult(plan.ref, tag, plan.hash, str(local["Id"]), digest, skipped=True, lock=plan.lock)
    if not stale_base and plan.registry and (remote := _registry_digest(plan)):
        echo(f"skipped: {plan.ref} already exists in the registry ({remote})")
        return BuildResult(plan.ref, tag, plan.hash, None, remote, skipped=True, lock=plan.lock)
    log_path = (
        cache_dir() / "logs" / f"{plan.stack.label}-{plan.hash[:12]}-{time.strftime('%Y%m%dT%H%M%S')}.log"
    )
    echo(f"building {plan.ref} with {plan.builder.description}; log: {log_path}")
    partial = plan.request.tag
    try:
        with _progress(plan.display, echo) as on_line:
            buildkit.stream_build(
                plan.argv, env=plan.builder.env(os.environ), log_path=log_path, timeout=BUILD_TIMEOUT_S, on_line=on_line
            )
        image_id = (plan.request.iidfile.read_text().strip() if plan.request.iidfile else "") or str(
            c.images.get(partial).id
        )
        if plan.local_base is not None:
            verify_local_base(c, image_id, plan.local_base)
        for line in smoke_test(c, partial, plan.stack):
            echo(f"smoke: {line}")
        engine.tag(c, image_id, plan.ref)
    finally:
        engine.untag(c, partial)
    echo(f"built {plan.ref} ({image_id})")
    digest = _ensure_pushed(plan, c, echo, replace=bool(stale_base)) if push else None
    return BuildResult(
        plan.ref, tag, plan.hash, image_id, digest, skipped=False, log_path=str(log_path), lock=plan.lock
    )


def _built_on_other_base(local: dict[str, Any] | None, base: dict[str, Any] | None) -> str | None:
    """Why an image of the same content hash must be built again: it sits on another local base than the
    daemon's now (scripts/infra/up.sh re-made it), which the hash cannot see; None when it may be reused."""
    if local is None or base is None:
        return None
    was = engine.labels_of(local).get(BASE_ID_LABEL)
    if was is None or was == base["Id"]:
        return None
    return f"rebuilding: the image was built on local base {was}, the daemon's is now {base['Id']}"


def _registry_digest(plan: Plan) -> str | None:
    if not plan.registry:
        return None
    try:
        return reg.manifest_digest(reg.parse_ref(plan.ref))
    except InfraError:
        return None


def _ensure_pushed(plan: Plan, c: Any, echo: Echo, *, replace: bool = False) -> str:
    """Push unless the registry has the tag already (replace: it names the image built on an older local base)."""
    remote = reg.manifest_digest(reg.parse_ref(plan.ref))
    if remote and not replace:
        echo(f"push skipped: the registry already has {plan.ref} ({remote})")
        return remote
    digest = engine.push(c, plan.ref)
    echo(f"pushed {plan.ref} ({digest})")
    if not plan.builder.buildx:  # the inline-cache image a second machine builds from
        cache_ref = f"{plan.registry}:buildcache-{plan.stack.label}"
        # one local tag for every build of the stack: two builds at once (two projects' demos in one
        # CI) would untag it under each other's push ("tag does not exist"), so one pushes at a time
        with _lock(f"buildcache-{plan.stack.label}"):
            engine.tag(c, plan.ref, cache_ref)
            try:
                engine.push(c, cache_ref)
            finally:
                engine.untag(c, cache_ref)
    return digest


@contextmanager
def _progress(mode: str, echo: Echo) -> Iterator[Callable[[str], None]]:
    """On a tty, a progress bar per stage; otherwise BuildKit's plain lines as they come, or
    ("stages") one line per stage once all its steps are done (every line is in the build log)."""
    if mode == "stages":
        progress = buildkit.StageProgress()

        def built(line: str) -> None:
            if (stage := progress.feed(line)) is not None and progress.stages[stage][0] == progress.stages[stage][1]:
                echo(f"built stage {stage} ({progress.stages[stage][1]}/{progress.stages[stage][1]})")

        yield built
        return
    if mode != "tty":
        yield echo
        return
    # rich (~60 ms to import) only where a terminal shows the bars: dry runs and piped builds never load it
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    stages = buildkit.StageProgress()
    tasks: dict[str, Any] = {}
    with Progress(
        TextColumn("{task.description:<14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    ) as bar:

        def feed(line: str) -> None:
            stages.feed(line)
            for name, (done, total) in stages.stages.items():
                if name not in tasks:
                    tasks[name] = bar.add_task(name, total=total)
                bar.update(tasks[name], completed=done, total=total)

        yield feed
