"""The one readiness poller against a scripted probe and a clock the test moves: exact stages and timings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stackbuild.effects.readiness import Pace, Readiness, wait_ready


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class Scripted:
    """Each layer answers from its own script; the last answer repeats. Records the call order."""

    def __init__(self, *, port: list[bool], health: list[bool] | None = None, generate: list[bool] | None = None,
                 crash_at_poll: int | None = None) -> None:
        self.answers = {"port": iter(port), "health": iter(health or [True]), "generate": iter(generate or [True])}
        self.last: dict[str, bool] = {}
        self.calls: list[str] = []
        self.polls = 0
        self.crash_at_poll = crash_at_poll

    def _next(self, layer: str) -> tuple[bool, str]:
        self.calls.append(layer)
        it: Iterator[bool] = self.answers[layer]
        self.last[layer] = next(it, self.last.get(layer, False))
        return self.last[layer], f"{layer} {'ok' if self.last[layer] else 'no'}"

    def crashed(self) -> str | None:
        self.polls += 1
        return "unit failed/failed" if self.polls == self.crash_at_poll else None

    def port_open(self) -> tuple[bool, str]:
        return self._next("port")

    def health(self) -> tuple[bool, str]:
        return self._next("health")

    def identity(self) -> str | None:
        return None

    def generate(self) -> tuple[bool, str]:
        return self._next("generate")


def run(probe: Scripted, start: float = 10.0, ready: float | None = None) -> tuple[Readiness, Clock]:
    clock = Clock()
    return wait_ready(probe, start_deadline_s=start, ready_deadline_s=ready,
                      pace=Pace(interval_s=1.0, clock=clock.now, sleep=clock.sleep)), clock


def test_layers_in_order_each_tried_once_the_one_before_holds() -> None:
    probe = Scripted(port=[False, False, True], health=[False, True])
    ready, clock = run(probe)
    assert ready == Readiness(True, "ready", "generate ok", 3.0, {"port": 2.0, "health": 3.0, "generate": 3.0})
    assert probe.calls == ["port", "port", "port", "health", "health", "generate"]
    assert clock.t == 103.0


def test_port_gets_the_start_deadline() -> None:
    ready, _ = run(Scripted(port=[False]), start=3.0)
    assert (ready.ok, ready.stage, ready.seconds, ready.layers) == (False, "port", 4.0, {})
    assert ready.detail == "not ready after 4s (stuck at: port; port no)"


def test_health_gets_the_ready_deadline_from_when_the_port_opened() -> None:
    # the port opens at 5 s, later than the 3 s ready deadline: /health still gets its own 3 s
    probe = Scripted(port=[False] * 5 + [True], health=[False])
    ready, _ = run(probe, start=10.0, ready=3.0)
    assert (ready.ok, ready.stage, ready.seconds, ready.layers) == (False, "health", 9.0, {"port": 5.0})
    assert probe.calls.count("health") == 4


def test_a_failed_first_generation_is_final() -> None:
    probe = Scripted(port=[True], generate=[False, True])
    ready, _ = run(probe)
    assert (ready.ok, ready.stage, ready.detail) == (False, "generate", "generate no")
    assert probe.calls == ["port", "health", "generate"]


def test_a_crash_is_reported_at_once_not_at_the_deadline() -> None:
    probe = Scripted(port=[False], crash_at_poll=3)
    ready, _ = run(probe, start=600.0)
    assert (ready.ok, ready.stage, ready.detail, ready.seconds) == (False, "crashed", "unit failed/failed", 2.0)
    assert probe.calls == ["port", "port"]


def test_the_http_probe_tolerates_http_failures_but_not_an_interruption(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from stackbuild.effects import http
    from stackbuild.effects.readiness import HttpProbe
    from stackbuild.errors import StackbuildError

    def refused(*a: object, **k: object) -> str:
        raise http.NoAnswer("POST", "http://127.0.0.1:9/v1/completions", "Connection refused")

    monkeypatch.setattr(http, "complete", refused)
    assert HttpProbe("http://127.0.0.1:9").generate() == (
        False, "POST http://127.0.0.1:9/v1/completions: no answer (Connection refused)")

    class Interrupted(StackbuildError):  # what a deploy's SIGTERM handler raises
        pass

    def interrupted(*a: object, **k: object) -> str:
        raise Interrupted("SIGTERM")

    monkeypatch.setattr(http, "complete", interrupted)
    with pytest.raises(Interrupted):
        HttpProbe("http://127.0.0.1:9").generate()
