"""`stackbuild report`: the results table, conclusion and plot, from the ledger."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("report")
@click.option("--ledger", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Ledger file (default: .stackbuild/ledger.db under the project root).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Markdown file to write (default: report.md next to the ledger); the plot goes beside it.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout instead.")
@click.option("--no-plot", is_flag=True, help="Skip the plot.")
@click.pass_context
def report_cmd(ctx: click.Context, ledger: Path | None, out: Path | None, as_json: bool, no_plot: bool) -> None:
    """Write the results table, per-concurrency tables, conclusion and plot."""
    from stackbuild.errors import InputError
    from stackbuild.paths import stack_root
    from stackbuild.results.ledger import Ledger, default_ledger_path
    from stackbuild.results.report import build_report
    from stackbuild.results.writer import report_path_for, write_report

    path = ledger or default_ledger_path(stack_root((ctx.obj or {}).get("root")))
    if not path.is_file():
        raise InputError(f"{path}: no ledger yet; run `stackbuild gate --ledger {path}` or a deploy first, "
                         "or pass --ledger")
    if out is not None:
        from stackbuild.results.outputs import check_writable

        check_writable(out, "--out")
    with Ledger(path) as db:
        if as_json:
            click.echo(json.dumps(build_report(db.gate_runs(), db.deploys(), db.builds()).to_json(), indent=2))
            return
        written = write_report(db, out or report_path_for(path), plot=not no_plot)
    click.echo(f"report: {written}")
