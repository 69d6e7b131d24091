"""Running a coroutine from synchronous code, safe against a signal handler that raises.

A deploy turns SIGTERM/SIGINT into an exception raised wherever the main thread is
(flows/deploy_host.py), so the incumbent is put back. Two places must not see that raise:

- `asyncio.Runner` building or closing its event loop: a half-made loop's `__del__` prints a
  traceback. Blocking the signals does not help: Python runs its handlers in the main thread
  whichever thread the kernel delivered to (SSH keeps threads of its own). So the handler hands
  its raise to `deliver`, which holds it while `held()` is active and raises it as the hold ends.
- The running loop itself. A handler runs between any two bytecodes of the main thread, and while
  a loop runs that is often inside one of its callbacks (a transport's recv, a timer), where the
  loop logs the raise and carries on: the signal was lost, and the handler had already ignored
  any next one (a deploy SIGTERMed mid-gate went on measuring). Where the raise was not lost it
  unwound through the loop's own frames and left tasks pending ("Task was destroyed but it is
  pending!", a fresh-clone CI, 2026-12-07). So while `run` drives a loop, `deliver` cancels its
  coroutine instead: the cancellation unwinds every await and its cleanup (HTTP sessions closed),
  and the raise comes out of `run` once the loop is closed. A coroutine that swallows the
  cancellation is cancelled again every CANCEL_AGAIN_S. Where the handler interrupts the code of
  that coroutine itself (not a callback, not a task it started), the raise is made there, as
  outside a loop: the gate's checks before any load block on a server that may never answer.

Only the main thread's loops count: Python runs signal handlers there, and a fleet's hosts run
their gates in threads of their own, where a raise held or delivered would land in the wrong thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

# how soon a coroutine that swallowed the cancellation is cancelled again: long enough for its
# cleanup's awaits (closing a session takes milliseconds) to finish first
CANCEL_AGAIN_S = 0.5

_held = 0
_waiting: list[Callable[[], None]] = []
# the coroutine `run` is driving now, with its loop: where a delivered raise becomes a cancellation
_running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []


def deliver(act: Callable[[], None]) -> None:
    """For a signal handler: `act()` now; when the current hold ends; or, while `run` drives a loop,
    once that loop has cancelled its coroutine and closed."""
    if _held:
        _waiting.append(act)
    elif _running and asyncio.current_task(_running[-1][0]) is not _running[-1][1]:
        # in the loop's own frames, a callback's, or another task's (whose `except Exception`
        # could swallow a raise): cancel the coroutine `run` drives
        loop, task = _running[-1]
        _waiting.append(act)
        # thread-safe: the handler may have interrupted the loop anywhere, even inside call_soon
        loop.call_soon_threadsafe(_cancel_until_done, loop, task)
    else:
        # outside any loop, or in the code of the coroutine `run` drives (the gate's blocking
        # checks before any load exists: a server that never answers must not hold the signal)
        act()


def _cancel_until_done(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    if not task.done():
        task.cancel()
        loop.call_later(CANCEL_AGAIN_S, _cancel_until_done, loop, task)


def _main() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def held() -> Iterator[None]:
    global _held
    if not _main():
        yield
        return
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held and _waiting:
            act = _waiting[0]
            _waiting.clear()
            act()


def run(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """`asyncio.run(make())`, with the loop built and closed under `held()`.

    The coroutine is made only inside the running loop, so a signal can never orphan it; a
    signal while it runs cancels it, and its raise comes out of here once the loop is closed.
    """
    runner = asyncio.Runner()  # builds nothing yet
    depth = len(_running)
    try:
        with held():
            runner.get_loop()
        return runner.run(_made(make))
    finally:
        with held():  # a raise that waits (a signal, or one held since the loop ran) comes as this ends
            del _running[depth:]
            runner.close()


async def _made(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    task = asyncio.current_task()
    if task is not None and _main():
        _running.append((asyncio.get_running_loop(), task))
    return await make()
