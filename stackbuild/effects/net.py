"""Loopback helpers shared by the local test host, the simulator launcher and the smoke test."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

from stackbuild.errors import InputError

# the kernel's source ports for outgoing connections (Linux's default where it cannot be read)
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
# how far below that range a free port is looked for
_SPAN = 12000
# every port free_port handed out in this process: never handed out again. Two calls in a row
# (a spec's port and staging_port) found the same port free, neither bound yet, once in a
# fresh-clone CI (2026-12-07: "staging_port 25597 is runtime.port too")
_GIVEN: set[int] = set()
# where free_port looks instead, as LO-HI (HI not included): two processes given disjoint ranges
# never pick the same port. The tests give each pytest-xdist worker (and the commands it runs) a
# slice of its own (tests/conftest.py): a port one picked and binds only minutes later (a fixture's
# fleet ports, a demo's gateway) was open to any other worker's pick until then
PORTS_ENV = "STACKBUILD_PORTS"


def ephemeral_low(path: Path = _EPHEMERAL) -> int:
    """The lowest port the kernel hands out as an outgoing connection's source port."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_range(environ: dict[str, str] | None = None, ephemeral: Path = _EPHEMERAL) -> tuple[int, int]:
    """[low, high) of the ports free_port picks from: STACKBUILD_PORTS when set, else the _SPAN
    ports below the kernel's ephemeral range."""
    value = (os.environ if environ is None else environ).get(PORTS_ENV, "").strip()
    if not value:
        top = ephemeral_low(ephemeral)
        return max(1024, top - _SPAN), top
    low, sep, high = value.partition("-")
    if not (sep and low.isdigit() and high.isdigit() and 1024 <= int(low) < int(high) <= 65536):
        raise InputError(f"{PORTS_ENV}={value!r}: give LOW-HIGH, 1024 <= LOW < HIGH <= 65536 "
                         "(ports from LOW up to, not including, HIGH), or unset it")
    return int(low), int(high)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now (the caller binds it soon after), and
    not one this process was given before, from port_range(): by default below the kernel's
    ephemeral range, since a port the kernel picks for bind(0) comes from that range, and any
    outgoing connection (an HTTP client, ssh, docker) may take it as its source port before the
    caller binds it (a fresh-clone CI refused a fleet host: "port 54955 is in use by another process")."""
    low, high = port_range()
    pick = random.SystemRandom()
    for _ in range(200):
        port = pick.randrange(low, high)
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
