"""`lock`: resolve a stack's closure (default), tell whether the committed lock is current (--check),
or prove it installs and passes the image's own checks on this machine (--verify)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from stackbuild.errors import EXIT_GATE_FAILED, InputError
from stackbuild.spec.stack import Stack


def _root(ctx: click.Context) -> Path | None:
    root: Path | None = (ctx.obj or {}).get("root")
    return root


@click.command("lock")
@click.argument("stacks", nargs=-1)
@click.option("--variant", default=None, help="Lock with this variant overlay applied.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the lock here instead of stacks/locks/STACK.txt (its audit goes beside it).",
)
@click.option("--offline", is_flag=True, help="Resolve from uv's cache and audit from the committed audit + cache.")
@click.option("--gateway", is_flag=True,
              help="Lock the stack's gateway (smg) instead, into stacks/locks/gateway/ (see docs/gateway.md).")
@click.option("--check", is_flag=True, help="Offline: exit 1 if a committed lock no longer answers its spec.")
@click.option("--verify", is_flag=True, help="Install the lock into a scratch venv and run the image's checks.")
@click.option("--python", "python", default=None, metavar="PATH", help="--verify: the interpreter to use.")
@click.option("--keep-venv", is_flag=True, help="--verify: keep the scratch venv (its path is printed).")
@click.option(
    "--venv",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="--verify: install into DIR and keep it; a later --verify of the same lock reuses it (flags in seconds).",
)
@click.pass_context
def lock_cmd(
    ctx: click.Context,
    stacks: tuple[str, ...],
    variant: str | None,
    out: Path | None,
    offline: bool,
    gateway: bool,
    check: bool,
    verify: bool,
    python: str | None,
    keep_venv: bool,
    venv: Path | None,
) -> None:
    """Resolve STACK's whole Python closure into a hash-pinned lock and audit its native wheels.

    The lock (stacks/locks/STACK.txt; STACK.VARIANT.txt for a variant whose
    closure differs) pins every distribution by sha256 with the index it came
    from, as of lock.exclude_newer, and the base image by the digest its
    registry names for the tag now (where the registry answers; else the
    header says it is unpinned and `validate` says how to pin it; --offline
    keeps the committed record); the audit (STACK.audit.json beside it)
    records, per native wheel, the CUDA libraries it links and the GPU arches it
    carries. Beside them: the source stages' hash-pinned build tools
    (STACK.build-tools.txt; each source.ref's commit is in the lock's header) and
    the pinned sglang release's flag table (sglang-VERSION.flags.json, what
    `validate --offline` reads). Errors (a newer CUDA major than the stack's, a
    component with no kernel image for its arches, no resolution) print located
    at the YAML line that brought them in, and nothing is written.

    --check (offline; every stack when none is named): exit 1 when a committed
    lock, audit, build-tools lock or flag table no longer answers the spec.

    --verify: install the lock (pip, hash-checked, wheels only, --no-deps, from
    the wheel cache) into a scratch venv of the stack's Python, then `pip check`,
    the image's verify_image.py (every locked version, torch.version.cuda) and
    sglang's own parser on exactly the rendered server flags. Exit 1 when a check
    fails (a flag sglang rejects is named), 4 when it cannot run (no such
    Python, the index unreachable). The cuda13 closure: about 6 minutes with its
    wheels cached (10.5 GB installed); --venv DIR keeps the install, and a
    later --verify of the same lock reuses it (under 30 s).
    """
    if check:
        _check(ctx, stacks, variant)
        return
    if len(stacks) != 1:
        raise InputError("name exactly one stack (several, or none for all, only with --check)")
    from stackbuild.spec.load import load_stack

    spec = load_stack(stacks[0], root=_root(ctx), variant=variant)
    if verify:
        _verify(spec, python, keep_venv, venv)
        return
    if gateway:
        _gateway(spec, out, offline)
        return
    _resolve(spec, out, offline)


def _gateway(spec: Stack, out: Path | None, offline: bool) -> None:
    from stackbuild.spec.lock.resolve import write
    from stackbuild.spec.lock.smg import lock_gateway

    path, text = lock_gateway(spec, offline=offline)
    write(out or path, text)
    click.echo(f"wrote {out or path}")


def _resolve(spec: Stack, out: Path | None, offline: bool) -> None:
    from stackbuild.image.registry import base_digest
    from stackbuild.spec.lock import run as lockrun

    result = lockrun.lock_stack(spec, offline=offline, progress=lambda m: click.echo(m, err=True),
                                base_digest=base_digest)
    if out is not None:
        result.redirect(out)
    for f in result.findings:
        click.echo(str(f), err=True)
    errors = [f for f in result.findings if f.severity == "error"]
    if errors:
        raise InputError(f"{len(errors)} error(s) in the resolved closure of {spec.label}; nothing was written")
    written = lockrun.write(result)
    for row in lockrun.table(spec, result):
        click.echo(row)
    click.echo(f"wrote {', '.join(map(str, written))}")


def _locked(ctx: click.Context, names: tuple[str, ...], variant: str | None) -> list[Stack]:
    """Each named stack (all by default), and each of its variants that resolves to a lock of its own."""
    from stackbuild.paths import list_stacks
    from stackbuild.spec.load import load_stack
    from stackbuild.spec.lock.target import own_lock

    out = []
    for name in names or tuple(str(r.path) for r in list_stacks(_root(ctx))):
        base = load_stack(name, root=_root(ctx))
        for v in [variant] if variant else [None, *base.variants]:
            stack = base if v is None else load_stack(name, root=_root(ctx), variant=v)
            if v is None or v == variant or own_lock(stack):  # a variant named is checked, whichever lock it uses
                out.append(stack)
    return out


def _check(ctx: click.Context, names: tuple[str, ...], variant: str | None) -> None:
    from stackbuild.cli.main import set_exit
    from stackbuild.spec.lock.check import current
    from stackbuild.spec.lock.target import lock_path, target_of

    stale = 0
    for stack in _locked(ctx, names, variant):
        t = target_of(stack)
        findings = current(stack)
        for f in findings:
            click.echo(str(f), err=True)
        errors = [f for f in findings if f.severity == "error"]
        stale += bool(errors)
        if t is None and not errors:
            click.echo(f"{stack.label}: nothing to lock")
        elif not errors:
            when = f", as of {t.exclude_newer}" if t and t.exclude_newer else ""
            click.echo(f"{stack.label}: up to date: {lock_path(stack).relative_to(stack.root)}{when}")
    if stale:
        set_exit(EXIT_GATE_FAILED)


def _verify(spec: Stack, python: str | None, keep: bool, venv: Path | None) -> None:
    from stackbuild.render.lockctx import verify_script
    from stackbuild.render.stack import launch_args
    from stackbuild.spec.components import dist_of
    from stackbuild.spec.lock import check, verify
    from stackbuild.spec.lock.locked import torch_cuda
    from stackbuild.spec.lock.target import target_of

    t = target_of(spec)
    lock = check.read_lock(spec)
    stale = check.freshness(spec, t, lock)
    if stale or t is None or lock is None:
        raise InputError("; ".join(str(f) for f in stale) or f"{spec.label}: nothing to verify (no sglang closure)")
    inputs = verify.Inputs(
        label=spec.label,
        python=spec.python,
        lock=lock,
        target=t,
        verify_script=verify_script(),
        torch_cuda=torch_cuda(spec, lock.text),
        server_args=launch_args(spec),
        sglang=lock.entries[sg].version if (sg := dist_of("sglang")) in lock.entries else None,
    )
    t0 = time.monotonic()
    click.echo(f"verifying {spec.label}: {len(lock.entries)} locked distributions, python {spec.python}")
    verify.verify(inputs, python=python, keep=keep, venv=venv, say=lambda m: click.echo(f"  {m}"))
    click.echo(f"verified {spec.label} in {time.monotonic() - t0:.0f} s")
