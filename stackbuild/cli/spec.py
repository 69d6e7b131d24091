"""`list`, `validate`, `render`: the commands that only read specs and write text (`lock`: cli/lock.py)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import click

from stackbuild.errors import EXIT_GATE_FAILED, Finding, InputError, SpecError


def _root(ctx: click.Context) -> Path | None:
    root: Path | None = (ctx.obj or {}).get("root")
    return root


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def list_cmd(ctx: click.Context, as_json: bool) -> None:
    """List the stacks and their variants."""
    from stackbuild.paths import list_stacks
    from stackbuild.spec.load import load_stack

    rows: list[dict[str, Any]] = []
    for ref in list_stacks(_root(ctx)):
        try:
            s = load_stack(ref.path, root=_root(ctx))
            rows.append(
                {
                    "name": s.name,
                    "path": ref.display,
                    "description": s.description,
                    "engine": s.server.engine,
                    "cuda": s.cuda,
                    "sglang": s.sglang_version,
                    "variants": list(s.variants),
                    "ok": True,
                }
            )
        except SpecError as err:
            rows.append({"name": ref.name, "path": ref.display, "ok": False, "error": str(err.findings[0])})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        if not r["ok"]:
            click.echo(f"{r['name']:<10} INVALID  {r['error']}")
            continue
        what = f"cuda {r['cuda']}, sglang {r['sglang']}" if r["engine"] == "sglang" else "simulator, no GPU"
        click.echo(f"{r['name']:<10} {what:<28} variants: {', '.join(r['variants']) or '-'}")


def _targets(ctx: click.Context, names: tuple[str, ...]) -> list[str]:
    from stackbuild.paths import list_stacks

    return list(names) or [str(r.path) for r in list_stacks(_root(ctx))]


def _check_all(ctx: click.Context, name: str, offline: bool, variants: list[str | None] | None = None) -> list[Finding]:
    """Findings for a stack and each of its variants, deduplicated by position."""
    from stackbuild.fleet.inventory import fleet_findings
    from stackbuild.spec.check import check_stack
    from stackbuild.spec.load import load_stack

    found: dict[str, Finding] = {}
    base = load_stack(name, root=_root(ctx))
    for v in variants if variants is not None else [None, *base.variants]:
        try:
            stack = base if v is None else load_stack(name, root=_root(ctx), variant=v)
            findings = check_stack(stack, offline=offline) + fleet_findings(stack)
        except SpecError as err:
            findings = err.findings
        for f in findings:
            found.setdefault(str(f), f)
    return list(found.values())


@click.command("validate")
@click.argument("stacks", nargs=-1)
@click.option(
    "--offline",
    is_flag=True,
    help="Never download: SGLang flag tables from stacks/locks/ or the cache; patches unchecked without the wheel.",
)
@click.pass_context
def validate_cmd(ctx: click.Context, stacks: tuple[str, ...], offline: bool) -> None:
    """Check stack specs (all of them by default) and every variant.

    Problems print as PATH:LINE:COL: error|warning: MESSAGE [rule]; any error exits 2.
    """
    errors = warnings = 0
    targets = _targets(ctx, stacks)
    for name in targets:
        try:
            findings = _check_all(ctx, name, offline)
        except SpecError as err:
            findings = err.findings
        for f in findings:
            click.echo(str(f), err=True)
            errors += f.severity == "error"
            warnings += f.severity == "warning"
    if errors:
        raise InputError(f"{errors} error(s), {warnings} warning(s) in {len(targets)} stack(s)")
    click.echo(f"ok: {len(targets)} stack(s) valid" + (f", {warnings} warning(s)" if warnings else ""))


def write_atomically(out: Path, files: dict[str, str]) -> None:
    """Every file goes to a temp name first; a failure leaves earlier versions untouched."""
    staged: list[tuple[str, Path]] = []
    try:
        for rel, text in files.items():
            dest = out / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            staged.append((tmp, dest))
        for tmp, dest in staged:
            os.replace(tmp, dest)
    finally:
        for tmp, _ in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)


def outputs_for(label: str, files: dict[str, str], out: Path | None, root: Path) -> tuple[Path, dict[str, str]]:
    """With --out: every file under DIR. Without: the committed `Dockerfile.<label>` at the root."""
    if out is not None:
        return out, files
    return root, {f"Dockerfile.{label}": files["Dockerfile"]}


@click.command("render")
@click.argument("stack")
@click.option("--variant", default=None, help="Apply this variant overlay.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write Dockerfile, units/, stack.lock.json, patches/ (and gateway/ with a gateway) here "
    "(default: only Dockerfile.<stack> at the project root).",
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if the files on disk differ.")
@click.option("--offline", is_flag=True, help="Never download (flag tables from stacks/locks/ or the cache).")
@click.pass_context
def render_cmd(
    ctx: click.Context, stack: str, variant: str | None, out: Path | None, check: bool, offline: bool
) -> None:
    """Render the Dockerfile, systemd units and stack.lock.json of STACK."""
    from stackbuild.cli.main import set_exit
    from stackbuild.image.context import rendered_for_image
    from stackbuild.spec.load import load_stack

    spec = load_stack(stack, root=_root(ctx), variant=variant)
    findings = _check_all(ctx, stack, offline, variants=[variant])
    errors = [f for f in findings if f.severity == "error"]
    for f in findings:
        click.echo(str(f), err=True)
    if errors:
        raise InputError(f"{len(errors)} error(s): fix them before rendering; nothing was written")
    from stackbuild.render.gateway import render_gateway

    rendered = rendered_for_image(spec)
    dest, files = outputs_for(spec.label, rendered.files | render_gateway(spec).files, out, spec.root)
    if check:
        stale = [
            rel
            for rel, text in files.items()
            if not (dest / rel).is_file() or (dest / rel).read_text(encoding="utf-8") != text
        ]
        for rel in stale:
            click.echo(
                f"{dest / rel}: stale; run 'stackbuild render {stack}"
                f"{' --variant ' + variant if variant else ''}{' --out ' + str(out) if out else ''}'",
                err=True,
            )
        if stale:
            set_exit(EXIT_GATE_FAILED)
        else:
            click.echo(f"up to date: {', '.join(str(dest / r) for r in files)}")
        return
    try:
        write_atomically(dest, files)
    except OSError as err:  # nothing half-written: write_atomically renames only when all are staged
        raise InputError(f"--out {dest}: cannot write {err.filename or dest} ({err.strerror}); "
                         "pass a writable directory") from None
    for rel in files:
        click.echo(f"wrote {dest / rel}")
    click.echo(f"content hash {rendered.hash12}")
