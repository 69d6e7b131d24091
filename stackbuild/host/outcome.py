"""The per-step report a deploy, rollback or status returns (data, plus its text form)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from stackbuild.effects.prometheus import OTHER_CLIENTS
from stackbuild.errors import EXIT_GATE_FAILED, EXIT_INCONCLUSIVE, EXIT_INFRA, EXIT_OK
from stackbuild.results import display


@dataclass
class Step:
    name: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class DeployReport:
    host: str
    service: str
    stack: str
    image: str
    strategy: str
    outcome: str = "failed"  # promoted | rolled-back | refused | failed | planned
    exit_code: int = EXIT_INFRA
    cause: str | None = None
    crash_signature: str | None = None
    crash_line: str | None = None
    verdict: str | None = None
    downtime_s: float | None = None
    outages: list[tuple[float, float]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    needs_recovery: bool = False  # the connection died: the host still has a pending marker
    gate_json: str | None = None
    host_facts: dict[str, str] = field(default_factory=dict)  # GPU model/count, driver, arch (preflight)
    logs: str = ""  # journal + container logs of a failed candidate (tail)
    live: display.Sink | None = None  # told each step as it starts and ends (results/display.py)

    def _tell(self, ev: display.Step) -> None:
        if self.live is not None:
            self.live(ev)

    @contextmanager
    def step(self, name: str) -> Iterator[Step]:
        st = Step(name, False, 0.0)
        t0 = time.monotonic()
        self._tell(display.Step(self.host, name))
        try:
            yield st
            st.ok = True
        except BaseException as err:
            st.detail = st.detail or _first_line(err)
            raise
        finally:
            st.seconds = round(time.monotonic() - t0, 3)
            self.steps.append(st)
            self._tell(display.Step(self.host, name, st.ok, st.seconds, st.detail))

    def note(self, name: str, ok: bool, detail: str, seconds: float = 0.0) -> None:
        self.steps.append(Step(name, ok, round(seconds, 3), detail))
        self._tell(display.Step(self.host, name, ok, round(seconds, 3), detail))

    def finish(self, outcome: str, cause: str | None = None, exit_code: int | None = None) -> None:
        self.outcome = outcome
        self.cause = cause
        if exit_code is not None:
            self.exit_code = exit_code
        elif outcome in ("promoted", "planned"):
            self.exit_code = EXIT_OK
        elif self.verdict == "inconclusive":
            self.exit_code = EXIT_INCONCLUSIVE
        elif outcome == "rolled-back":
            self.exit_code = EXIT_GATE_FAILED
        else:
            self.exit_code = EXIT_INFRA
        if self.outages:
            self.downtime_s = round(sum(b - a for a, b in self.outages), 3)

    def durations(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.steps:
            out[s.name] = round(out.get(s.name, 0.0) + s.seconds, 3)
        return out

    def to_json(self) -> str:
        d: dict[str, Any] = asdict(self)
        d.pop("logs")
        d.pop("gate_json")
        d.pop("live")
        return json.dumps(d, indent=2)

    def render(self, full: bool = True) -> str:
        """Every step with its detail (full: the step log, `rollback`), or the summary a deploy ends
        with: the time each stage took, and only the steps that failed or warn."""
        lines = [
            f"deploy {self.stack} -> {self.host} ({self.service}, {self.strategy})",
            f"  image: {self.image}",
        ]
        if not full and self.steps:
            stages = display.stage_times((s.name, s.seconds) for s in self.steps)
            lines.append(f"  took {sum(t for _, t in stages):.2f}s: " + ", ".join(f"{n} {t:.2f}s" for n, t in stages))
        for s in self.steps if full else [s for s in self.steps if _worth_a_line(s)]:
            mark = "ok  " if s.ok else "FAIL"
            lines.append(f"  {mark} {s.name:<14} {s.seconds:7.2f}s  {s.detail}")
        lines.append(f"  outcome: {self.outcome} (exit {self.exit_code})")
        if self.verdict:
            lines.append(f"  gate verdict: {self.verdict}")
        if self.cause:
            lines.append(f"  cause: {self.cause}")
        if self.crash_signature:
            lines.append(f"  crash signature: {self.crash_signature}: {self.crash_line}")
        if self.logs and self.exit_code:
            tail = [ln for ln in self.logs.splitlines() if ln.strip()][-10:]
            lines.append("  candidate log tail (journal, container):")
            lines += [f"    {ln[:200]}" for ln in tail]
        if self.downtime_s is not None:
            lines.append(
                f"  downtime: {self.downtime_s:.2f}s in {len(self.outages)} outage(s) "
                "(incumbent stop -> a server serving again)"
            )
        return "\n".join(lines)


# An ok step whose detail a person must still read: what an earlier run left was put back (a
# stale lease, a pending deploy), or the server starts without a secret it names (host/deploy.py).
_WARNINGS = ("broke a stale lock", "the server gets none", OTHER_CLIENTS)


def _worth_a_line(s: Step) -> bool:
    """In a deploy's summary: the steps that failed, and the ok ones that did something out of the ordinary."""
    return not s.ok or display.stage_of(s.name, "") == "recover" or any(w in s.detail for w in _WARNINGS)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__
