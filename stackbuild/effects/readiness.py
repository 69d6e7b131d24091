"""The one readiness poller: the deploy, the restore, the gate, the smoke test and the simulator
launcher all wait for a server with it.

Layers, each tried only once the one before holds: the port listens, GET /health
answers 200, one real generation returns text. Between polls the probe is asked
whether the server is gone for good (a systemd unit that failed or is restarting,
a container that exited), so a crash is reported at once instead of at the deadline.
A generation that fails once /health is 200 is final: a server that says it is
healthy and cannot generate is a broken candidate, not a slow one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from stackbuild.effects import http
from stackbuild.errors import InfraError

LAYERS = ("port", "health", "generate")


class Probe(Protocol):
    def crashed(self) -> str | None:
        """Why the server will never serve (it exited, failed, is being restarted), else None."""

    def port_open(self) -> tuple[bool, str]: ...

    def health(self) -> tuple[bool, str]: ...

    def generate(self) -> tuple[bool, str]: ...

    def identity(self) -> str | None:
        """What the server says it is (sglang's weight_version), None when nothing says: a deploy
        compares it with the one its candidate's unit was started with (host/unit_probe.py)."""


@dataclass(frozen=True)
class Pace:
    """How often to poll, and the clock and sleep to do it with (fakes pass their own)."""

    interval_s: float = 0.5
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


@dataclass(frozen=True)
class Readiness:
    ok: bool
    stage: str  # "ready", or where it stopped: "crashed" | "port" | "health" | "generate"
    detail: str
    seconds: float
    layers: dict[str, float] = field(default_factory=dict)  # layer -> seconds until it first held
    identity: str = ""  # the server's identity once confirmed its own unit's (host/deploy_steps.py)

    def raise_unless_ok(self, what: str) -> None:
        if not self.ok:
            raise InfraError(f"{what} not ready: {self.stage} failing ({self.detail}); check the server's log")


@dataclass(frozen=True)
class HttpProbe:
    """The three layers over HTTP at a base URL; `gone` says when the process behind it died."""

    url: str
    gone: Callable[[], str | None] = lambda: None
    generate_timeout_s: float = 30.0

    def crashed(self) -> str | None:
        return self.gone()

    def port_open(self) -> tuple[bool, str]:
        ok = http.port_open(self.url)
        return ok, "" if ok else f"nothing listens at {self.url}"

    def health(self) -> tuple[bool, str]:
        code = http.status(self.url.rstrip("/") + "/health")
        return code == 200, f"/health answered {code if code is not None else 'nothing'}"

    def generate(self) -> tuple[bool, str]:
        try:
            text = http.complete(self.url, "Say hello.", 8, timeout=self.generate_timeout_s)
        except http.HttpFailure as err:
            return False, str(err).splitlines()[0][:300]
        if not text.strip():
            return False, f"{self.url}: a real generation returned empty text"
        return True, f"generated {text[:40]!r}"

    def identity(self) -> str | None:
        # sglang's /get_model_info returns server_args.weight_version (http_server.py get_model_info);
        # /server_info has it too, but asks the scheduler for its internal state on the way
        try:
            reply = http.get(self.url.rstrip("/") + "/get_model_info", timeout=10.0)
            doc = reply.json() if reply.status == 200 else None
        except (http.HttpFailure, ValueError):
            return None
        got = doc.get("weight_version") if isinstance(doc, dict) else None
        return got if isinstance(got, str) else None


def wait_ready(
    probe: Probe,
    *,
    start_deadline_s: float,
    ready_deadline_s: float | None = None,
    pace: Pace | None = None,
) -> Readiness:
    """Poll until the server serves, crashes, or a deadline passes.

    The port must open within `start_deadline_s` of the call (weights load before it
    listens); /health and the generation then get `ready_deadline_s` (default: the
    same) from the moment the port opened.
    """
    p = pace or Pace()
    ready_s = start_deadline_s if ready_deadline_s is None else ready_deadline_s
    t0 = p.clock()
    layers: dict[str, float] = {}
    last = ""
    while True:
        elapsed = p.clock() - t0
        stage = next(lay for lay in LAYERS if lay not in layers)
        over = elapsed > start_deadline_s if stage == "port" else elapsed - layers["port"] > ready_s
        if over:
            return Readiness(False, stage, f"not ready after {elapsed:.0f}s (stuck at: {stage}; {last})",
                             elapsed, layers)
        gone = probe.crashed()
        if gone is not None:
            return Readiness(False, "crashed", gone, p.clock() - t0, layers)
        if stage == "port":
            ok, last = probe.port_open()
            if ok:
                layers["port"] = p.clock() - t0
                stage = "health"
        if stage == "health":
            ok, last = probe.health()
            if ok:
                layers["health"] = p.clock() - t0
                stage = "generate"
        if stage == "generate":
            ok, detail = probe.generate()
            layers.update({"generate": p.clock() - t0} if ok else {})
            return Readiness(ok, "ready" if ok else "generate", detail, p.clock() - t0, layers)
        p.sleep(p.interval_s)
