"""The gateway client against a real `smg` (installed from the committed hash lock) in front of real simulators.

One behaviour each: the worker API (list, add, add again, remove, remove again, put back);
a drain that waits for the requests a worker still runs; and a rollover -- drain and stop
one server, start and add another, drain the second -- under a streaming client that
counts every request through the gateway: none may fail.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers_gateway import (
    SmgProc,
    install_smg,
    loopback_gateway,
    smg_running,
    stream_once,
    worker_api_contract,
)

from stackbuild.effects import http
from stackbuild.effects.gateway import HttpGateway, Unauthorized, Worker, drain, worker_in_flight
from stackbuild.effects.net import free_port
from stackbuild.effects.prometheus import parse_metrics
from stackbuild.gate.background import BackgroundLoad
from stackbuild.sim.process import SimProc, sim

pytestmark = [pytest.mark.integration, pytest.mark.network]

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def smg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_smg(tmp_path_factory.mktemp("smg"))


@pytest.fixture
def sims() -> Iterator[tuple[SimProc, SimProc]]:
    with sim("--enable-metrics") as a, sim("--enable-metrics") as b:
        yield a, b


def served(s: SimProc) -> float:
    return parse_metrics(http.get(f"{s.url}/metrics").body.decode())["sglang:num_requests_total"]


def halt(s: SimProc) -> None:
    """Stop a server for good (its fixture still cleans up after it)."""
    s.proc.stop(grace_s=10)


@pytest.fixture
def gateway(smg: Path, sims: tuple[SimProc, SimProc], tmp_path: Path) -> Iterator[tuple[SmgProc, HttpGateway]]:
    """smg started with the first simulator (as its unit's --worker-urls), serving once that one is ready."""
    a, _ = sims
    with smg_running(smg, loopback_gateway(), [a.url], tmp_path / "smg.log") as p:
        gw = HttpGateway(p.url, key=p.key)
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                if [w.url for w in gw.workers() if w.routable] == [a.url]:
                    break
            except http.HttpFailure:
                pass
            assert time.monotonic() < deadline and p.proc.poll() is None, f"smg never served:\n{p.output()}"
            time.sleep(0.1)
        yield p, gw


def test_worker_api_on_real_smg(gateway: tuple[SmgProc, HttpGateway], sims: tuple[SimProc, SimProc]) -> None:
    p, gw = gateway
    a, b = sims
    worker_api_contract(gw, a.url, b.url, TIMEOUT_S)
    assert gw.remove(a.url, timeout_s=TIMEOUT_S) is True
    before = served(a), served(b)
    assert [stream_once(p.url, 8) for _ in range(4)] == [None] * 4
    assert (served(a), served(b)) == (before[0], before[1] + 4)  # a drained worker gets nothing new
    assert gw.add(a.url, timeout_s=TIMEOUT_S).routable  # and its share again once it is back
    assert [stream_once(p.url, 8) for _ in range(4)] == [None] * 4
    assert served(a) == before[0] + 2


def test_drain_waits_for_what_the_worker_still_runs(gateway: tuple[SmgProc, HttpGateway],
                                                    sims: tuple[SimProc, SimProc]) -> None:
    p, gw = gateway
    a, _ = sims
    results: list[str | None] = []
    streams = [threading.Thread(target=lambda: results.append(stream_once(p.url, 200))) for _ in range(3)]
    for t in streams:
        t.start()
    deadline = time.monotonic() + TIMEOUT_S
    while worker_in_flight(a.url) != 3:
        assert time.monotonic() < deadline, "the streams never reached the worker"
        time.sleep(0.02)
    done = drain(gw, a.url, in_flight=lambda: worker_in_flight(a.url), timeout_s=TIMEOUT_S)
    for t in streams:
        t.join(timeout=TIMEOUT_S)
    assert done.ok, done.detail
    assert done.seconds > 0.5  # 200 tokens take seconds at the simulator's speed: it waited for them
    assert results == [None, None, None]  # and they all ran to the end on the drained worker
    assert worker_in_flight(a.url) == 0 and [w for w in gw.workers() if w.routable] == []


def test_rollover_through_the_gateway_fails_no_request(gateway: tuple[SmgProc, HttpGateway],
                                                       sims: tuple[SimProc, SimProc]) -> None:
    p, gw = gateway
    a, b = sims
    gw.add(b.url, timeout_s=TIMEOUT_S)
    # the newcomer starts now, outside the gateway; the client stops before any server does
    with sim("--enable-metrics") as c, BackgroundLoad(p.url, clients=3) as client:
        assert client.wait_for(10, TIMEOUT_S)
        # the first server leaves: out of the pool, idle, then stopped for good
        assert drain(gw, a.url, in_flight=lambda: worker_in_flight(a.url), timeout_s=TIMEOUT_S).ok
        halt(a)
        assert client.wait_for(client.sent + 10, TIMEOUT_S)
        # the new one joins, then the second leaves the same way
        gw.add(c.url, timeout_s=TIMEOUT_S)
        assert client.wait_for(client.sent + 10, TIMEOUT_S)
        assert drain(gw, b.url, in_flight=lambda: worker_in_flight(b.url), timeout_s=TIMEOUT_S).ok
        halt(b)
        assert client.wait_for(client.sent + 20, TIMEOUT_S)
        on_c = served(c)
    assert (client.failed, client.failures) == (0, [])
    assert client.ok >= 50
    assert on_c >= 10  # the last part of the run went through the newcomer


def _status(method: str, url: str, key: str | None = None, doc: object = None) -> int:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    body = None if doc is None else json.dumps(doc).encode()
    return http.request(method, url, body=body, headers=headers, timeout=10.0).status


def test_control_plane_takes_only_stackbuilds_key_and_no_argument_or_log_holds_it(
        gateway: tuple[SmgProc, HttpGateway], sims: tuple[SimProc, SimProc]) -> None:
    p, gw = gateway
    a, b = sims
    rogue = {"url": b.url}
    assert _status("GET", f"{p.url}/workers") == 401
    assert _status("POST", f"{p.url}/workers", doc=rogue) == 401
    assert _status("POST", f"{p.url}/workers", key="not-the-key", doc=rogue) == 401
    wid = gw.workers()[0].id
    assert _status("DELETE", f"{p.url}/workers/{wid}") == 401
    assert [w.url for w in gw.workers()] == [a.url]  # nothing changed: the rogue is not in, A still is
    with pytest.raises(Unauthorized):
        HttpGateway(p.url, key="not-the-key").add(b.url, timeout_s=TIMEOUT_S)
    assert stream_once(p.url, 8) is None  # the serving path stays open without gateway.api_keys
    cmdline = Path(f"/proc/{p.proc.pid}/cmdline").read_bytes()
    assert p.key.encode() not in cmdline and p.key not in p.log.read_text(errors="replace")


def test_data_plane_keys_guard_the_serving_path(smg: Path, sims: tuple[SimProc, SimProc], tmp_path: Path) -> None:
    a, _ = sims
    gw_spec = loopback_gateway(api_keys=("TEAM_A",))
    with smg_running(smg, gw_spec, [a.url], tmp_path / "smg.log", env={"TEAM_A": "team-a-secret"}) as p:
        api = HttpGateway(p.url, key=p.key)
        deadline = time.monotonic() + TIMEOUT_S
        while not [w for w in _workers_or_none(api) if w.routable]:
            assert time.monotonic() < deadline and p.proc.poll() is None, f"smg never served:\n{p.output()}"
            time.sleep(0.1)
        doc = {"model": "sim/model", "prompt": "hi", "max_tokens": 2}
        assert _status("POST", f"{p.url}/v1/completions", doc=doc) == 401
        assert _status("POST", f"{p.url}/v1/completions", key="wrong", doc=doc) == 401
        assert _status("POST", f"{p.url}/v1/completions", key="team-a-secret", doc=doc) == 200
        assert _status("POST", f"{p.url}/v1/completions", key=p.key, doc=doc) == 401  # the control key is not one
        assert b"team-a-secret" not in Path(f"/proc/{p.proc.pid}/cmdline").read_bytes()


def _workers_or_none(api: HttpGateway) -> list[Worker]:
    try:
        return api.workers()
    except http.HttpFailure:
        return []


def test_a_worker_that_comes_up_after_the_gateway_serves_within_seconds(smg: Path, tmp_path: Path) -> None:
    """What a boot does: the gateway starts first (or beside) its servers; with smg's 30 s default it served
    404 for ~31 s after every reboot (issue 29). Retried every second, it serves within 5 s of the server."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with smg_running(smg, loopback_gateway(), [url], tmp_path / "smg.log") as p:
        deadline = time.monotonic() + TIMEOUT_S
        while _status_or_none(f"{p.url}/health") != 200:  # the gateway is up, its worker is not
            assert time.monotonic() < deadline and p.proc.poll() is None, f"smg never answered:\n{p.output()}"
            time.sleep(0.1)
        time.sleep(2.5)  # past its first check of the worker: the one smg used to wait 30 s after
        with sim("--enable-metrics", port=port):  # returns once the server answers /health
            served_at = time.monotonic()
            while stream_once(p.url, 4, timeout=5.0) is not None:
                assert time.monotonic() - served_at < TIMEOUT_S, f"the gateway never served:\n{p.output()}"
                time.sleep(0.1)
            lag = time.monotonic() - served_at
    assert lag < 5.0, f"the gateway served {lag:.1f}s after its server"


def _status_or_none(url: str) -> int | None:
    try:
        return http.get(url, timeout=5.0).status
    except http.HttpFailure:
        return None
