"""Readiness in layers, with crash detection from systemd between polls.

Layers, each only tried once the one before holds: the port listens on the
host; GET /health answers 200; one real generation returns text. Each poll
also asks systemd about the unit, so a candidate that crashed (failed, or
systemd is restarting it) is reported at once instead of at the deadline.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from stackbuild.host.preflight import parse_listening_ports
from stackbuild.host.ssh import Remote, sh_argv

POLL_SCRIPT = (
    'systemctl show "$1" -p ActiveState -p SubState -p NRestarts -p Result -p ExecMainStatus; '
    "echo ---; cat /proc/net/tcp /proc/net/tcp6 2>/dev/null"
)


@dataclass(frozen=True)
class UnitState:
    active: str
    sub: str
    restarts: int
    result: str
    exit_status: str

    @property
    def crashed(self) -> bool:
        return (
            self.active == "failed"
            or self.sub == "auto-restart"
            or self.restarts > 0
            or (self.active == "inactive" and self.result not in ("", "success"))
            or (self.active == "inactive" and self.exit_status not in ("", "0"))
        )

    def describe(self) -> str:
        return (
            f"unit {self.active}/{self.sub}, result {self.result or '-'}, "
            f"exit status {self.exit_status or '-'}, restarts {self.restarts}"
        )


def parse_show(text: str) -> UnitState:
    kv = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    restarts = kv.get("NRestarts", "0")
    return UnitState(
        active=kv.get("ActiveState", ""),
        sub=kv.get("SubState", ""),
        restarts=int(restarts) if restarts.isdigit() else 0,
        result=kv.get("Result", ""),
        exit_status=kv.get("ExecMainStatus", ""),
    )


@dataclass(frozen=True)
class Readiness:
    ok: bool
    stage: str  # "ready" | "crashed" | "port" | "health" | "generation"
    detail: str
    seconds: float


def http_status(url: str, timeout: float = 3.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (OSError, ValueError):
        return None


def generate_probe(base_url: str) -> tuple[bool, str]:
    """One real generation (the gate's own probe call); (ok, what it saw)."""
    from stackbuild.errors import InfraError
    from stackbuild.gate.readiness import generate_once

    try:
        text = generate_once(base_url, timeout=30.0)
    except InfraError as err:
        return False, str(err).splitlines()[0][:300]
    return True, f"generated {text[:40]!r}"


@dataclass
class Probes:
    health: Callable[[str], int | None] = http_status
    generate: Callable[[str], tuple[bool, str]] = generate_probe
    sleep: Callable[[float], None] = time.sleep
    interval_s: float = 0.5


def wait_ready(
    remote: Remote,
    unit: str,
    port: int,
    base_url: str,
    *,
    start_deadline_s: float,
    ready_deadline_s: float,
    probes: Probes | None = None,
) -> Readiness:
    """Poll until the server serves, crashes, or a deadline passes.

    The port must open within `start_deadline_s` of the start (loading weights);
    /health and the generation then get `ready_deadline_s` from the port opening.
    """
    p = probes or Probes()
    t0 = time.monotonic()
    t_port = t0
    stage = "port"
    last = ""
    while True:
        now = time.monotonic()
        elapsed = now - t0
        over = (elapsed > start_deadline_s) if stage == "port" else (
            now - t_port > ready_deadline_s)
        if over:
            return Readiness(
                False, stage, f"not ready after {elapsed:.0f}s (stuck at: {stage}; {last})", elapsed
            )
        res = remote.run(
            sh_argv(POLL_SCRIPT, unit), check=False, what="poll the unit", changes=False
        )
        show, _, tcp = res.stdout.partition("---")
        st = parse_show(show)
        if st.crashed:
            return Readiness(False, "crashed", st.describe(), time.monotonic() - t0)
        if stage == "port":
            if port in parse_listening_ports(tcp):
                stage = "health"
                t_port = time.monotonic()
            else:
                last = f"port {port} not listening; {st.describe()}"
        if stage == "health":
            code = p.health(f"{base_url}/health")
            if code == 200:
                stage = "generation"
            else:
                last = f"/health answered {code if code is not None else 'nothing'}"
        if stage == "generation":
            ok, detail = p.generate(base_url)
            if ok:
                return Readiness(True, "ready", detail, time.monotonic() - t0)
            return Readiness(False, "generation", detail, time.monotonic() - t0)
        p.sleep(p.interval_s)
