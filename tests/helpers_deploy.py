"""Builders for unit tests of the deploy flow and convergence on the in-memory FakeHost.

The shipped `sim` stack is deployed with its real unit renderer; the host is a
FakeHost whose clock is the poller's, so every deadline and downtime is exact; the
gate is `FakeGate`, which answers with the verdict chosen for whatever image serves
the URL it is handed (so it also proves what it measured).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from stackbuild.gate.result import GateResult, ProbeResult, Workload
from stackbuild.host.deploy import deploy
from stackbuild.host.outcome import DeployReport
from stackbuild.host.request import DeployRequest, LiveIncumbent, Services
from stackbuild.host.state import HostPaths, HostState, read_state
from stackbuild.render.stack import render_unit
from stackbuild.spec.load import load_stack
from stackbuild.spec.profile import GateProfile
from stackbuild.spec.stack import Stack
from stackbuild.testing.fake_host import SERVES, Behaviour, FakeHost

ROOT = Path(__file__).resolve().parents[1]
REPO = "127.0.0.1:5000/stackbuild"
D_INC, D_CAND = "sha256:" + "1" * 64, "sha256:" + "2" * 64
INCUMBENT, CANDIDATE = f"{REPO}@{D_INC}", f"{REPO}@{D_CAND}"
PORT, STAGING = 31000, 31001  # the sim stack's runtime.port and staging_port
SVC = "stackbuild-sim"
PATHS = HostPaths("/var/lib/stackbuild", SVC)
MAIN, CAND_UNIT = "stackbuild-sim.service", "stackbuild-sim-candidate.service"
ENV, CAND_ENV = f"/etc/stackbuild/{SVC}.env", f"/etc/stackbuild/{SVC}-candidate.env"
BACKUP = f"{PATHS.base}/secrets.incumbent.env"
OPERATOR_ENV = "# the operator's own file\nHF_TOKEN=operator-value\nOTHER=keep-me\n"


@cache
def sim_stack() -> Stack:
    return load_stack("sim", root=ROOT)


NOW = datetime.now(UTC).isoformat(timespec="seconds")


def profile(stack: Stack | None = None) -> GateProfile:
    return (stack or sim_stack()).gate.profiles["quick"]


def gate_result(verdict: str, bars: tuple[str, ...] = (), probe_ok: bool = True, *, name: str = "c",
                fingerprint: str = "f", reasons: tuple[str, ...] = (), host: dict[str, str] | None = None
                ) -> GateResult:
    # stamped now: a stored baseline older than the profile's bound is measured again
    return GateResult(name=name, url="u", started_at=NOW, finished_at=NOW, workload=Workload(),
                      fingerprint=fingerprint, levels=(), verdict=verdict,  # type: ignore[arg-type]
                      bars=bars, probe=ProbeResult(passed=probe_ok), reasons=reasons, host=host or {})


@dataclass
class GateCall:
    url: str
    name: str
    baseline: str | None  # the baseline's name
    served_by: str | None  # the image serving the URL's port when the gate ran
    units: dict[str, str]  # every unit's ActiveState then
    running: dict[str, tuple[str, int, float, dict[str, str]]]  # unit -> image, port, started at, env
    live: str | None = None  # a live baseline: its URL and the image serving it ("URL image")


@dataclass
class FakeGate:
    """`Services.gate`: the verdict chosen for the image it finds serving (default pass).

    Without a baseline it answers as the real gate does, "reference" (with a violated bar when
    the chosen verdict is fail). `raises`: raised instead, once the call is recorded.
    """

    host: FakeHost
    verdicts: dict[str, str] = field(default_factory=dict)
    raises: BaseException | None = None
    calls: list[GateCall] = field(default_factory=list)

    def __call__(self, url: str, prof: GateProfile, name: str, baseline: GateResult | LiveIncumbent | None,
                 ) -> GateResult:
        image = self.host.serving(int(url.rsplit(":", 1)[1]))
        units = {u: s.active for u, s in sorted(self.host.units.items())}
        running = {u: (p.image, p.port, p.started_at, dict(p.env)) for u, p in sorted(self.host.running.items())}
        live = (f"{baseline.url} {self.host.serving(int(baseline.url.rsplit(':', 1)[1]))}"
                if isinstance(baseline, LiveIncumbent) else None)
        self.calls.append(GateCall(url, name, baseline.name if baseline else None, image, units, running, live))
        if self.raises is not None:
            raise self.raises
        v = self.verdicts.get(image or "", "pass")
        fp = prof.workload().fingerprint()
        if baseline is None:
            bars = ("C=1: 4.0 tok/s is below min_tok_s_c1 10",) if v == "fail" else ()
            return gate_result("reference", bars, name=name, fingerprint=fp, host={"access": "direct"})
        reasons = () if v == "pass" else (f"C=8: {v} against {baseline.name}",)
        return gate_result(v, name=name, fingerprint=fp, reasons=reasons, host={"access": "direct"})


@dataclass
class Sleeps:
    """`Services.sleep`: what the flow slept, on the host's clock."""

    host: FakeHost
    slept: list[float] = field(default_factory=list)

    def __call__(self, s: float) -> None:
        self.slept.append(s)
        self.host.sleep(s)


def fake_host(**servers: Behaviour) -> FakeHost:
    """A host whose registry has both images; `servers` by role: incumbent=, candidate=."""
    return FakeHost(registry={INCUMBENT, CANDIDATE},
                    servers={INCUMBENT: servers.get("incumbent", SERVES), CANDIDATE: servers.get("candidate", SERVES)})


def services(host: FakeHost, gate: FakeGate | None = None, **kw: Any) -> Services:
    kw = {"echo": lambda _: None, "sleep": Sleeps(host), **kw}
    return Services(render_unit=render_unit, gate=gate or FakeGate(host), endpoint=host.endpoint,
                    http_probe=host.http_probe, pace=host.pace(0.5), **kw)


def request(strategy: str = "swap", image: str = CANDIDATE, secrets: dict[str, str] | None = None,
            stack: Stack | None = None) -> DeployRequest:
    return DeployRequest(stack=stack or sim_stack(), image=image, digest=image.split("@")[1], strategy=strategy,
                         profile=profile(stack), secrets=secrets or {})


def run(host: FakeHost, strategy: str = "swap", image: str = CANDIDATE, gate: FakeGate | None = None,
        secrets: dict[str, str] | None = None, stack: Stack | None = None, **kw: Any) -> DeployReport:
    return deploy(host, request(strategy, image, secrets, stack), services(host, gate, **kw))


def with_incumbent(env: str | None = None, **servers: Behaviour) -> FakeHost:
    """A host where the flow itself promoted INCUMBENT (swap, first deploy); commands cleared.

    `env`: the operator's secrets file, there before anything was deployed (mode 0600).
    """
    host = fake_host(**servers)
    if env is not None:
        host.dirs["/etc/stackbuild"] = host.now
        host.files[ENV], host.modes[ENV] = env, 0o600
    rep = run(host, image=INCUMBENT)
    assert (rep.outcome, rep.exit_code) == ("promoted", 0), rep.render()
    host.commands.clear()
    host.sleep(100.0)  # the incumbent has served a while
    return host


def unit_text(image: str, port: int = PORT, name: str = SVC, env_file: str | None = None) -> str:
    """The unit the flow renders (the real renderer)."""
    return render_unit(sim_stack(), image=image, port=port, name=name, env_file=env_file)


def steps(rep: DeployReport) -> list[tuple[str, bool]]:
    return [(s.name, s.ok) for s in rep.steps]


def state(host: FakeHost) -> HostState:
    return read_state(host, PATHS)


_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def settled(st: HostState) -> dict[str, Any]:
    """The state file's content with its timestamps checked for form and masked (they are wall-clock)."""
    d = json.loads(st.model_dump_json())
    for rel in ("current", "previous"):
        if d[rel]:
            assert _ISO.match(d[rel]["at"]), d[rel]["at"]
            d[rel]["at"] = "T"
    if d["last_at"]:
        assert _ISO.match(d["last_at"])
        d["last_at"] = "T"
    return d


def snapshot(host: FakeHost) -> tuple[object, ...]:
    """Everything on the host a deploy could change ('nothing changed' means equal)."""
    procs = {u: (p.image, p.port, p.started_at, dict(p.env)) for u, p in host.running.items()}
    units = {u: (s.active, s.sub, s.result) for u, s in host.units.items()}
    return dict(host.files), dict(host.modes), dict(host.dirs), units, procs, set(host.images), dict(host.loaded)


def reboot_serves(host: FakeHost, port: int = PORT) -> str | None:
    """Power-cycle the host, give its servers time to load: the image serving `port` then, if any."""
    host.reboot()
    host.sleep(5.0)
    return host.serving(port)


def assert_boots_what_the_state_names(host: FakeHost) -> None:
    """The boot invariant: after a power cycle the host serves the release its state file names
    (nothing when it names none), from its committed unit in /etc (the main unit, or the staging
    unit a promotion through the gateway left it on), on its port, with nothing left in /run and
    none of the service's other units enabled or running (a gateway unit is another service)."""
    cur = state(host).current
    assert reboot_serves(host, cur.port if cur else PORT) == (cur.image if cur else None)
    assert not [f for f in host.files if f.startswith("/run/")]
    ours = {u: p for u, p in host.enabled.items() if u.startswith(SVC)}
    if cur is not None:
        unit = PATHS.unit_of(cur.slot)
        path = PATHS.unit_path(unit)
        assert host.fragments[unit] == path and ours == {unit: path}
        assert host.files[path] == cur.unit
        assert [u for u in host.running if u.startswith(SVC)] == [unit]
    else:
        assert not ours


def owners_masked(commands: list[list[str]]) -> list[list[str]]:
    """argv with the lock owner's JSON (pid and wall-clock times) masked as <owner>."""
    def mask(a: str) -> str:
        return "<owner>" if a.startswith("{") and '"pid"' in a else a
    return [[mask(a) for a in c] for c in commands]
