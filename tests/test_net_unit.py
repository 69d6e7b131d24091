"""Loopback ports for servers we start: free now, and out of the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from stackbuild.effects.net import ephemeral_low, free_port, port_free


def test_a_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    low = ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_someone_listens_on_is_not_free() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
        s.listen()
        assert not port_free(s.getsockname()[1])


def test_the_ephemeral_range_is_read_or_defaults(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    assert ephemeral_low(ranges) == 40000
    assert ephemeral_low(tmp_path / "missing") == 32768
    ranges.write_text("garbage")
    assert ephemeral_low(ranges) == 32768


def test_a_port_is_given_out_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec's port and staging_port come from two calls before either is bound: they must differ.
    Over a range of 20 ports, 20 calls without that memory would repeat one (all but certainly)."""
    from stackbuild.effects import net

    monkeypatch.setattr(net, "_SPAN", 20)
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == 20, sorted(ports)
