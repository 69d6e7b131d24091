"""What a systemd unit on a host looks like to the readiness poller (effects/readiness.py).

Each poll asks systemd about the unit, so a candidate that crashed (failed, or
systemd is restarting it) is reported at once instead of at the deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from stackbuild.effects.readiness import Probe
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


@dataclass
class UnitProbe:
    """The readiness probe of a systemd unit on a host: crash and port from the host, the rest over HTTP.

    The port is read from the host's own socket table, so a tunnel that accepts before
    the server listens cannot pass for an open port.
    """

    remote: Remote
    unit: str
    port: int
    http: Probe
    _tcp: str = ""

    def crashed(self) -> str | None:
        res = self.remote.run(sh_argv(POLL_SCRIPT, self.unit), check=False, what="poll the unit", changes=False)
        show, _, self._tcp = res.stdout.partition("---")
        st = parse_show(show)
        return st.describe() if st.crashed else None

    def port_open(self) -> tuple[bool, str]:
        if self.port in parse_listening_ports(self._tcp):
            return True, ""
        return False, f"port {self.port} not listening on the host"

    def health(self) -> tuple[bool, str]:
        return self.http.health()

    def generate(self) -> tuple[bool, str]:
        return self.http.generate()
