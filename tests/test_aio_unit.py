"""effects/aio: a raising signal handler's raise waits out the event loop's construction."""

from __future__ import annotations

import asyncio

import pytest

from stackbuild.effects import aio


class Boom(Exception):
    pass


def boom() -> None:
    raise Boom("signal")


def test_deliver_raises_at_once_outside_a_hold() -> None:
    with pytest.raises(Boom):
        aio.deliver(boom)


def test_deliver_waits_for_the_hold_to_end() -> None:
    seen: list[str] = []
    with pytest.raises(Boom), aio.held():
        aio.deliver(boom)
        seen.append("the held section ran to its end")
    assert seen == ["the held section ran to its end"]
    aio.deliver(lambda: seen.append("later signals act at once"))
    assert seen[-1] == "later signals act at once"


def test_a_signal_while_the_loop_is_built_raises_before_anything_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    real_get_loop = asyncio.Runner.get_loop

    def get_loop_then_signal(self: asyncio.Runner) -> asyncio.AbstractEventLoop:
        loop = real_get_loop(self)
        aio.deliver(boom)  # the handler ran while the loop was being built
        assert not made
        return loop

    async def work() -> None:
        made.append("coroutine")

    def make():  # type: ignore[no-untyped-def]
        made.append("made")
        return work()

    monkeypatch.setattr(asyncio.Runner, "get_loop", get_loop_then_signal)
    with pytest.raises(Boom):
        aio.run(make)
    assert made == []  # raised after the loop was whole, before the coroutine existed


def test_returns_the_coroutines_value() -> None:
    async def seven() -> int:
        return 7

    assert aio.run(seven) == 7
