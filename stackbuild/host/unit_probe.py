"""What systemd says of a unit on a host: the one place that asks it (`systemctl show`).

The readiness poller (effects/readiness.py) asks on each poll, so a candidate that crashed
(failed, or systemd is restarting it) is reported at once instead of at the deadline; the
soak asks on each sample; converge and status ask whether the unit runs and starts on boot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stackbuild.effects.readiness import Probe
from stackbuild.host.preflight import TCP_SCRIPT, parse_listening_ports
from stackbuild.host.ssh import Remote, sh_argv
from stackbuild.render.stack import identity_of

# Whether the process runs or died, and how (UnitState); whether it starts on boot, and from which file (BootFacts).
STATE_PROPERTIES = ("ActiveState", "SubState", "NRestarts", "Result", "ExecMainStatus", "InvocationID")
BOOT_PROPERTIES = ("ActiveState", "UnitFileState", "FragmentPath")


def show_argv(unit: str, properties: Sequence[str]) -> list[str]:
    return ["systemctl", "show", unit, *(a for p in properties for a in ("-p", p))]


# One round trip per poll: the unit's state, then the host's socket table (is the port listening).
POLL_SCRIPT = f'systemctl show "$1" {" ".join(f"-p {p}" for p in STATE_PROPERTIES)}; echo ---; {TCP_SCRIPT}'


@dataclass(frozen=True)
class UnitState:
    active: str
    sub: str
    restarts: int
    result: str
    exit_status: str
    invocation: str = ""  # systemd's id of this start of the unit ("" when it never started)

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


def _properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def parse_show(text: str) -> UnitState:
    kv = _properties(text)
    restarts = kv.get("NRestarts", "0")
    return UnitState(
        active=kv.get("ActiveState", ""),
        sub=kv.get("SubState", ""),
        restarts=int(restarts) if restarts.isdigit() else 0,
        result=kv.get("Result", ""),
        exit_status=kv.get("ExecMainStatus", ""),
        invocation=kv.get("InvocationID", ""),
    )


def unit_state(remote: Remote, unit: str) -> UnitState:
    res = remote.run(show_argv(unit, STATE_PROPERTIES), check=False, what="unit state", changes=False)
    return parse_show(res.stdout)


@dataclass(frozen=True)
class BootFacts:
    """What systemd says of a unit: running now, starting on boot, and from which file."""

    active: str
    enabled: str  # systemd's UnitFileState: enabled, disabled, ... ("" for no unit file)
    fragment: str  # the file systemd loaded it from ("" for none)


def boot_facts(remote: Remote, unit: str) -> BootFacts:
    res = remote.run(show_argv(unit, BOOT_PROPERTIES), check=False, what="unit state", changes=False)
    kv = _properties(res.stdout)
    return BootFacts(kv.get("ActiveState", ""), kv.get("UnitFileState", ""), kv.get("FragmentPath", ""))


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
    _invocation: str = ""

    def crashed(self) -> str | None:
        res = self.remote.run(sh_argv(POLL_SCRIPT, self.unit), check=False, what="poll the unit", changes=False)
        show, _, self._tcp = res.stdout.partition("---")
        st = parse_show(show)
        self._invocation = st.invocation
        return st.describe() if st.crashed else None

    def identity(self) -> str | None:
        return self.http.identity()

    @property
    def invocation(self) -> str:
        """systemd's id of the unit's current start, as of the last poll."""
        return self._invocation

    def confirm(self) -> tuple[str, str] | None:
        """None when the server on the port is this unit's own process, still running; else (the
        readiness stage it fails, "crashed" or "identity", and why).

        Asked once the layers held, and around the gate: a unit whose process died (a candidate that
        could not bind a port the incumbent holds) is a crash whatever answers there, and a server
        whose identity is not this start's is another process (IDENTITY_ARG)."""
        if (gone := self.crashed()) is not None:
            return "crashed", f"{gone}; its process is gone, whatever answers on port {self.port}"
        want = identity_of(self._invocation) if self._invocation else None
        got = self.http.identity()
        if want is None or got != want:
            return "identity", (f"the server on port {self.port} is not {self.unit}'s process: it says "
                                f"weight_version {got!r}, this start of the unit is {want!r}")
        return None

    def port_open(self) -> tuple[bool, str]:
        if self.port in parse_listening_ports(self._tcp):
            return True, ""
        return False, f"port {self.port} not listening on the host"

    def health(self) -> tuple[bool, str]:
        return self.http.health()

    def generate(self) -> tuple[bool, str]:
        return self.http.generate()
