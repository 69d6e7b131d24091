"""Live progress on a terminal (rich): one row per level, updated as runs finish."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text


class LiveProgress:
    """Callable progress sink for run_gate; use as a context manager."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.rows: dict[int, dict[str, Any]] = {}
        self.current = ""
        self.title = "gate"
        self._live = Live(self._render(), console=self.console, refresh_per_second=8,
                          transient=False)

    def __enter__(self) -> LiveProgress:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.update(self._render())
        self._live.__exit__(None, None, None)

    def _render(self) -> Group:
        t = Table(title=self.title, expand=False)
        for col in ("C", "candidate tok/s", "incumbent tok/s", "ratio [CI]", "failed", "verdict"):
            t.add_column(col)
        for c, row in sorted(self.rows.items()):
            t.add_row(str(c), " ".join(f"{x:.0f}" for x in row["cand"]),
                      " ".join(f"{x:.0f}" for x in row["inc"]), row.get("ratio", ""),
                      str(row["failed"]), row.get("verdict", "…"))
        return Group(t, Text(self.current, style="dim"))

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "start":
            self.title = f"gate {data['name']} @ {data['url']}"
        elif kind == "level":
            self.rows[data["concurrency"]] = {"cand": [], "inc": [], "failed": 0}
        elif kind == "request":
            self.current = (f"C={data['concurrency']} {data['side']} run {data['index'] + 1}: "
                            f"{data['done']}/{data['total']} requests")
        elif kind == "run":
            row = self.rows[data["concurrency"]]
            m = data["metrics"]
            row["cand" if data["side"] == "candidate" else "inc"].append(m.output_tok_s)
            row["failed"] += m.failed
        elif kind == "decision":
            lv = data["level"]
            row = self.rows[data["concurrency"]]
            if lv.ratio is not None:
                ci = f" [{lv.ci_low:.3f}, {lv.ci_high:.3f}]" if lv.ci_high is not None else ""
                row["ratio"] = f"{lv.ratio:.3f}{ci}"
            row["verdict"] = lv.verdict
        elif kind == "probe":
            self.current = "probe " + ("passed" if data["probe"].passed else "FAILED")
        self._live.update(self._render())
