"""The servers of the scripted in-memory host (see fake.py): how each image's server behaves
once a unit starts it, and what its HTTP layers answer (`FakeHttp`), in the host's clock."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Behaviour:
    """How a server from one image behaves once its unit starts (seconds on the host's clock)."""

    listens_after_s: float | None = 2.0  # None: never listens (loads forever)
    crash_after_s: float | None = None  # the process exits this long after its start...
    crash_log: tuple[str, ...] = ()  # ...printing these lines
    healthy: bool = True  # False: /health answers 503 forever
    failing_generations: int = 0  # the first N generations answer HTTP 500
    generation_error: str = "CUDA error: an illegal memory access was encountered"
    output: tuple[str, ...] = ("server: loading weights",)
    kernel_error: str | None = None  # the deploy's kernel import check fails with this (GPU stacks)


SERVES = Behaviour()
NEVER_LISTENS = Behaviour(listens_after_s=None)
UNHEALTHY = Behaviour(healthy=False)
FAILS_FIRST_GENERATION = Behaviour(failing_generations=1)


def crashes(*log: str, after_s: float = 0.0) -> Behaviour:
    return Behaviour(crash_after_s=after_s, crash_log=log)


@dataclass
class Proc:
    """A server process a unit runs (its container)."""

    image: str
    container: str
    port: int
    env: dict[str, str]
    started_at: float
    behaviour: Behaviour
    generations: int = 0
    logs: list[tuple[float, str]] = field(default_factory=list)
    weight_version: str = "default"  # --weight-version on its command line (the unit's identity)

    def listening(self, now: float) -> bool:
        after = self.behaviour.listens_after_s
        return after is not None and now >= self.started_at + after


class ServerHost(Protocol):
    """What the servers need of the host they run on (fake_systemd.FakeSystemd)."""

    now: float
    running: dict[str, Proc]

    def listening(self) -> set[int]: ...
    def log(self, unit: str, *lines: str) -> None: ...


@dataclass
class FakeHttp:
    """The server's HTTP layers at a URL on the fake host: whatever listens on that port answers."""

    host: ServerHost
    url: str

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/", 1)[0])

    def _proc(self) -> Proc | None:
        return next((p for p in self.host.running.values() if p.port == self.port and p.listening(self.host.now)),
                    None)

    def crashed(self) -> str | None:
        return None  # the unit's state says it (UnitProbe); HTTP alone cannot tell

    def port_open(self) -> tuple[bool, str]:
        ok = self.port in self.host.listening()
        return ok, "" if ok else f"nothing listens at {self.url}"

    def health(self) -> tuple[bool, str]:
        proc = self._proc()
        code = None if proc is None else 200 if proc.behaviour.healthy else 503
        return code == 200, f"/health answered {code if code is not None else 'nothing'}"

    def identity(self) -> str | None:
        proc = self._proc()
        return None if proc is None else proc.weight_version

    def generate(self) -> tuple[bool, str]:
        proc = self._proc()
        if proc is None:
            return False, f"POST {self.url}/v1/completions: no answer (ConnectionRefusedError: refused)"
        proc.generations += 1
        if proc.generations <= proc.behaviour.failing_generations:
            err = proc.behaviour.generation_error
            proc.logs.append((self.host.now, err))
            unit = next(u for u, p in self.host.running.items() if p is proc)
            self.host.log(unit, err)
            body = json.dumps({"object": "error", "message": err, "type": "InternalServerError", "code": 500})
            return False, f"POST {self.url}/v1/completions: HTTP 500: {body.encode()[:200]!r}"
        return True, "generated ' Hello there'"
