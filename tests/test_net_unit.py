"""Loopback ports for servers we start: free now, and out of the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from conftest import worker_ports

from stackbuild.effects.net import PORTS_ENV, ephemeral_low, free_port, port_free, port_range
from stackbuild.errors import InputError


def test_a_free_port_is_below_the_ephemeral_range_and_bindable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORTS_ENV, raising=False)
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

    monkeypatch.delenv(PORTS_ENV, raising=False)
    monkeypatch.setattr(net, "_SPAN", 20)
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == 20, sorted(ports)


def test_the_range_is_the_environments_when_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    assert port_range({}, ranges) == (20768, 32768)
    assert port_range({PORTS_ENV: " 23168-25568 "}, ranges) == (23168, 25568)
    for bad in ("25568-23168", "80-9000", "20000", "a-b", "20000-70000", "-5-10"):
        with pytest.raises(InputError, match=rf"^{PORTS_ENV}=.*: give LOW-HIGH, 1024 <= LOW < HIGH <= 65536"):
            port_range({PORTS_ENV: bad}, ranges)
    monkeypatch.setenv(PORTS_ENV, "30000-30010")
    ports = {free_port() for _ in range(5)}
    assert len(ports) == 5 and ports <= set(range(30000, 30010)), ports


def test_each_worker_gets_a_slice_of_its_own() -> None:
    """Five workers over the default range: five disjoint slices of 2400 ports, in order."""
    slices = [worker_ports(f"gw{i}", 5, 20768, 32768) for i in range(5)]
    assert slices == ["20768-23168", "23168-25568", "25568-27968", "27968-30368", "30368-32768"]


def test_this_worker_picks_from_its_own_slice() -> None:
    """tests/conftest.py sets the slice for each xdist worker (and what it starts); none outside xdist."""
    import os

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        count = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
        assert os.environ[PORTS_ENV] == worker_ports(worker, count, *port_range({}))
    else:
        assert PORTS_ENV not in os.environ
