"""The demos' gateway: its port on this machine, the URL printed as soon as it serves, and the demo's own
client streaming completions through it while the rollouts run (gate/background.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from stackbuild.effects.net import free_port, port_free
from stackbuild.errors import InfraError
from stackbuild.gate.background import BackgroundLoad, served_model
from stackbuild.spec.stack import Stack

SERVES_WITHIN_S = 60.0
CLIENT_PAUSE_S = 0.25


def gateway_port(stack: Stack) -> int | None:
    """The spec's gateway port when it is free here, else a free one (the demo's hosts share this machine)."""
    if stack.gateway is None:
        return None
    return stack.gateway.port if port_free(stack.gateway.port) else free_port()


def on_port(stack: Stack, port: int | None) -> Stack:
    """`stack` with its gateway on `port` (every deploy of the demo the same, so its unit stays unchanged)."""
    if stack.gateway is None or port is None:
        return stack
    return stack.model_copy(update={"gateway": stack.gateway.model_copy(update={"port": port})})


@contextmanager
def client(port: int | None, echo: Callable[[str], None]) -> Iterator[BackgroundLoad | None]:
    """Once the gateway routes to a server: `gateway: URL` printed, and the demo's client sending through it
    until the block ends; then how many requests it sent and how many failed."""
    if port is None:
        yield None
        return
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVES_WITHIN_S
    while served_model(url) is None:
        if time.monotonic() > deadline:
            raise InfraError(f"demo: the gateway at {url} routes to no server after {SERVES_WITHIN_S:.0f}s")
        time.sleep(0.5)
    echo(f"gateway: {url}")
    echo("demo: (anyone may send completions through it meanwhile; the demo's own client does, one at a time)")
    # paced: the rollouts' gates measure the servers on this very machine, and a client hammering the
    # incumbent would put that noise into their verdicts
    load = BackgroundLoad(url, clients=1, pause_s=CLIENT_PAUSE_S)
    try:
        with load:
            yield load
    finally:
        echo(f"demo: through the gateway during the rollouts: {load.summary()}")
