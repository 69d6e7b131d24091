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


def test_a_signal_inside_a_loop_callback_still_reaches_the_caller() -> None:
    """A handler can run while the loop is inside a callback (a transport's recv, a timer): the loop
    would log a raise there and carry on. It cancels the coroutine instead, and the raise comes out of
    run() once the loop is closed: the coroutine's cleanup ran, no task is left pending."""
    cleaned: list[str] = []

    async def work() -> str:
        asyncio.get_running_loop().call_later(0.01, aio.deliver, boom)  # as a handler run inside a callback
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append("finally")
        return "finished"  # never: the signal stops it

    with pytest.raises(Boom):
        aio.run(work)
    assert cleaned == ["finally"]


def test_a_coroutine_that_swallows_the_cancellation_is_cancelled_again() -> None:
    steps: list[str] = []

    async def stubborn() -> None:
        asyncio.get_running_loop().call_later(0.01, aio.deliver, boom)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            steps.append("swallowed")
        await asyncio.sleep(30)  # cancelled again: the signal is not lost
        steps.append("never")

    with pytest.raises(Boom):
        aio.run(stubborn)
    assert steps == ["swallowed"]


def test_no_pending_task_survives_a_signal(caplog: pytest.LogCaptureFixture) -> None:
    """The gate's shape: the main task waits on children (gather); none is left for the garbage
    collector to find pending ("Task was destroyed but it is pending!")."""
    done: list[int] = []

    async def child(i: int) -> None:
        try:
            await asyncio.sleep(30)
        finally:
            done.append(i)

    async def main() -> None:
        asyncio.get_running_loop().call_later(0.01, aio.deliver, boom)
        await asyncio.gather(*(child(i) for i in range(4)))

    with caplog.at_level("ERROR", logger="asyncio"), pytest.raises(Boom):
        aio.run(main)
    assert sorted(done) == [0, 1, 2, 3]
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def test_after_run_signals_act_at_once_again() -> None:
    async def quick() -> int:
        return 1

    assert aio.run(quick) == 1
    with pytest.raises(Boom):
        aio.deliver(boom)


def test_a_loop_in_another_thread_is_not_where_a_signal_goes() -> None:
    """A fleet's hosts gate in threads of their own; a signal (handled on the main thread) neither
    waits for their holds nor cancels their coroutines: it acts at once, on the main thread."""
    import threading

    started, release = threading.Event(), threading.Event()
    got: list[object] = []

    async def waits() -> str:
        started.set()
        while not release.is_set():
            await asyncio.sleep(0.01)
        return "done"

    t = threading.Thread(target=lambda: got.append(aio.run(waits)))
    t.start()
    assert started.wait(30)
    try:
        with pytest.raises(Boom):
            aio.deliver(boom)
    finally:
        release.set()
        t.join(30)
    assert got == ["done"]


def test_a_signal_in_the_coroutines_own_blocking_code_raises_there() -> None:
    """The gate checks the servers with blocking calls before any load exists (gate/runner.py
    _admit): a signal then raises at once, not when a server that never answers gives up."""
    after: list[str] = []

    async def blocking_check() -> None:
        aio.deliver(boom)  # as a handler run while this coroutine's own code blocks
        after.append("went on")

    with pytest.raises(Boom):
        aio.run(blocking_check)
    assert after == []
