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


def finished_requests(text: str) -> float | None:
    """Requests the server has finished since it started, from its /metrics text
    (`sglang:num_requests_total`, the counter sglang 0.5.23 bumps as a request finishes:
    observability/metrics_collector.py, as stackbuild/sim/metrics.py cites it). A labelled counter has
    no sample until its first request finishes, only its `# TYPE` line: 0 then. None when the server
    does not export it."""
    n = parse_metrics(text).get("sglang:num_requests_total")
    if n is None and re.search(r"^# TYPE sglang:num_requests_total counter$", text, re.M):
        return 0.0
    return n


# how a count of outside_requests is said (gate/decide.py's busy_notes); a deploy's summary shows the gate
# step that says it (host/outcome.py), which must not import the gate's decision code for a phrase
OTHER_CLIENTS = "request(s) of other clients"


def outside_requests(before: float | None, after: float | None, own: int) -> int | None:
    """Requests a server finished between two readings of its counter that were not the `own` ones sent
    to it meanwhile; None when either reading is missing. An own request the server counts only after
    its answer ended can make it read low, never high: at worst a busy server is missed, an idle one
    is never called busy."""
    if before is None or after is None:
        return None
    return max(0, round(after - before) - own)
