"""Plots next to the report: output tok/s and TTFT p99 vs concurrency, one series per config.

Written as SVG (each series a group with id `series-<config>`, so tests and
tools can find them) and PNG (for READMEs and chat). matplotlib is the `plot`
extra; without it the report is written without a plot.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from stackbuild.results.report import Group


def series_id(config: str) -> str:
    return "series-" + re.sub(r"[^A-Za-z0-9_-]+", "_", config)


def plot_group(group: Group, base: Path) -> list[Path]:
    """Write `base`.svg and `base`.png; return their paths."""
    # matplotlib is the optional `plot` extra and costs ~0.5 s to import: only a plot pays for it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tok, ax_ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = sorted(group.cells, key=lambda n: (n != group.reference, n))
    for name in names:
        cells = group.cells[name]
        cs = sorted(cells)
        label = f"{name} (reference)" if name == group.reference else name
        ax_tok.plot(cs, [cells[c].tok_s for c in cs], marker="o", label=label, gid=series_id(name))
        ax_ttft.plot(cs, [cells[c].ttft_p99_ms for c in cs], marker="o", label=label, gid=series_id(name) + "-ttft")
    for ax, title, unit in ((ax_tok, "output throughput", "tok/s"), (ax_ttft, "TTFT p99", "ms")):
        ax.set_xscale("log")
        ax.set_xticks(group.levels, [str(c) for c in group.levels])
        ax.set_xlabel("concurrency (C)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    ax_tok.legend(fontsize=8)
    fig.suptitle(f"workload {group.fingerprint} on {group.host_class}", fontsize=9)
    fig.tight_layout()
    out = []
    for ext in ("svg", "png"):
        path = base.with_suffix(f".{ext}")
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")  # fleet: threads too
        fig.savefig(tmp, format=ext, dpi=110, metadata={"Date": None} if ext == "svg" else None)
        os.replace(tmp, path)
        out.append(path)
    plt.close(fig)
    return out
