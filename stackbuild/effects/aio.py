"""Running a coroutine from synchronous code, safe against a signal handler that raises.

A deploy turns SIGTERM/SIGINT into an exception raised wherever the main thread is
(flows/deploy_host.py), so the incumbent is put back. Raised inside `asyncio.Runner` while it
builds or closes its event loop, it leaves a half-made loop whose `__del__` prints a
traceback. Blocking the signals does not help: Python runs its handlers in the main thread
whichever thread the kernel delivered to (SSH keeps threads of its own). So such a handler
hands its raise to `deliver`, which holds it while `held()` is active and raises it as the
hold ends, on the main thread, outside the loop's construction and teardown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

_held = 0
_waiting: list[Callable[[], None]] = []


def deliver(act: Callable[[], None]) -> None:
    """For a signal handler: `act()` now, or when the current hold ends."""
    if _held:
        _waiting.append(act)
    else:
        act()


@contextmanager
def held() -> Iterator[None]:
    global _held
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

    The coroutine is made only inside the running loop, so a signal can never orphan it.
    """
    runner = asyncio.Runner()  # builds nothing yet
    try:
        with held():
            runner.get_loop()
        return runner.run(_made(make))
    finally:
        with held():
            runner.close()


async def _made(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return await make()
