"""The one writer of results: the report (and its plot) from the ledger, refreshed after each record.

The recorder (recorder.py) calls `update_report` after every build, gate run and deploy it
records, and `stackbuild report` calls `write_report`; nothing else writes report.md.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from stackbuild.results.ledger import Ledger
from stackbuild.results.plot import plot_group
from stackbuild.results.report import Report, build_report, render_markdown


def _note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def report_path_for(ledger_path: Path) -> Path:
    return ledger_path.parent / "report.md"


def worth_a_plot(report: Report) -> bool:
    """Whether the first group's plot says something its tables do not: throughput and TTFT against
    concurrency need two levels or more (one level is one point a series, the table's own numbers),
    and at least one measured cell. A plot costs ~0.5 s of CPU (matplotlib's import, an SVG and a
    PNG: `stackbuild report` took 1.0-1.06 s with it, 0.43-0.53 s without), paid after every deploy
    that records."""
    return bool(report.groups) and len(report.groups[0].levels) > 1 and any(report.groups[0].cells.values())


def write_report(ledger: Ledger, out: Path, *, plot: bool = True, note: Callable[[str], None] = _note) -> Path:
    """Write the Markdown report (and its plot next to it) atomically; return the report path."""
    report = build_report(ledger.gate_runs(), ledger.deploys(), ledger.builds())
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_name = None
    if plot and worth_a_plot(report):
        try:
            paths = plot_group(report.groups[0], out.with_name(out.stem + "-throughput"))
            plot_name = next(p.name for p in paths if p.suffix == ".svg")
        except ImportError:  # matplotlib is the optional `plot` extra: the report still lands
            note("report: written without its plot: matplotlib is missing (pip install 'stackbuild[plot]')")
    text = render_markdown(report, plot_name)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}.{threading.get_ident()}")  # fleet: threads too
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out


def update_report(ledger_path: Path) -> Path:
    """Regenerate the report next to the ledger (after a build, gate or deploy) and return its path."""
    out = report_path_for(ledger_path)
    with Ledger(ledger_path) as ledger:
        write_report(ledger, out)
    return out
