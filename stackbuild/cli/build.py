"""`build` and `promote`: thin wrappers over stackbuild.image and stackbuild.image.registry."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("build")
@click.argument("stack")
@click.option("--variant", default=None, help="variant of the stack to build")
@click.option("--push", is_flag=True, help="push the image to the registry after the smoke test")
@click.option("--registry", default=None, metavar="HOST:PORT/REPO", help="default: the spec's host.registry")
@click.option("--no-cache", is_flag=True, help="ignore BuildKit's layer cache")
@click.option("--dry-run", is_flag=True, help="print the build command and context; build nothing")
@click.option("--progress", type=click.Choice(["auto", "tty", "plain"]), default="auto", show_default=True)
@click.option("--ledger", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Ledger file the build is recorded in (default: .stackbuild/ledger.db under the project root).")
@click.pass_context
def build_cmd(
    ctx: click.Context,
    stack: str,
    variant: str | None,
    push: bool,
    registry: str | None,
    no_cache: bool,
    dry_run: bool,
    progress: str,
    ledger: Path | None,
) -> None:
    """Build the stack image with BuildKit, smoke-test it, push it.

    A base image the lock pinned by digest is built from exactly that digest; a tag that names another
    one since the lock is refused (exit 2: relock, or pin the old digest in the spec). A local base
    (local/...) is pinned by the daemon's image id: the image is labelled with it and checked to sit
    on that base's layers.
    """
    from stackbuild.image.build import build_stack
    from stackbuild.paths import stack_root
    from stackbuild.results.ledger import default_ledger_path
    from stackbuild.results.recorder import Recorder
    from stackbuild.spec.load import load_stack

    root: Path | None = (ctx.obj or {}).get("root")
    spec = load_stack(stack, root=root, variant=variant)
    recorder = Recorder(ledger or default_ledger_path(stack_root(root)))
    if not dry_run:
        recorder.check()  # before the build: a bad --ledger is found in seconds, not after it
    result = build_stack(
        spec,
        root=root,
        registry=registry,
        push=push,
        no_cache=no_cache,
        dry_run=dry_run,
        progress=None if progress == "auto" else progress,
    )
    if not dry_run:
        recorder.build(spec, result)
        click.echo(result.repo_digest or result.image)


@click.command("promote")
@click.argument("image")
@click.option("--channel", required=True, help="channel tag to point at the image, e.g. stable")
@click.option("--registry", default=None, metavar="HOST:PORT/REPO", help="when IMAGE is a bare tag")
def promote_cmd(image: str, channel: str, registry: str | None) -> None:
    """Point a registry channel tag at an image digest (no rebuild, no layer pushed)."""
    from stackbuild.image.registry import parse_ref, promote

    digest = promote(image, channel, registry)
    ref = parse_ref(image if registry is None or "/" in image else f"{registry}:{image}")
    click.echo(f"{ref.name}:{channel} -> {digest}")
