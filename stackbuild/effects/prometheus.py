"""Reading a server's Prometheus /metrics text (pure): what traffic sampling and draining both count.

sglang exports `sglang:num_running_reqs` and `sglang:num_queue_reqs` (with
--enable-metrics) per scheduler; their sum is what the server has in flight.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value summed over its label sets}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None or line.startswith("#"):
            continue
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


def in_flight(metrics: Mapping[str, float]) -> float | None:
    """Requests running + queued; None when the server does not export them."""
    if "sglang:num_running_reqs" not in metrics:
        return None
    return metrics["sglang:num_running_reqs"] + metrics.get("sglang:num_queue_reqs", 0.0)
