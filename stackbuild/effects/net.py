"""Loopback helpers shared by the local test host, the simulator launcher and the smoke test."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# the kernel's source ports for outgoing connections (Linux's default where it cannot be read)
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
# how far below that range a free port is looked for
_SPAN = 12000
# every port free_port handed out in this process: never handed out again. Two calls in a row
# (a spec's port and staging_port) found the same port free, neither bound yet, once in a
# fresh-clone CI (2026-12-07: "staging_port 25597 is runtime.port too")
_GIVEN: set[int] = set()


def ephemeral_low(path: Path = _EPHEMERAL) -> int:
    """The lowest port the kernel hands out as an outgoing connection's source port."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now (the caller binds it soon after), and
    not one this process was given before, below the kernel's ephemeral range: a port the kernel
    picks for bind(0) comes from that range, and any outgoing connection (an HTTP client, ssh,
    docker) may take it as its source port before the caller binds it (a fresh-clone CI refused
    a fleet host: "port 54955 is in use by another process")."""
    top = ephemeral_low()
    pick = random.SystemRandom()
    for _ in range(200):
        port = pick.randrange(max(1024, top - _SPAN), top)
        if port not in _GIVEN and port_free(port):
            _GIVEN.add(port)
            return port
    with socket.socket() as s:  # all taken: what the kernel gives
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _GIVEN.add(port)
    return port


def port_free(port: int) -> bool:
    """Nobody listens on 127.0.0.1:`port` right now (it could be bound)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
