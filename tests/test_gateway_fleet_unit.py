"""The fleet behind the gateway, on scripted FakeHosts and the FakeGateway (its unit on h0, on h0's clock).

A client of the gateway sends one request on every command any host is sent, and each request
runs 2 s on the server it lands on: a server stopped while it had one in flight, or a moment
with no server in the pool, fails requests. The timeline interleaves the gateway's calls with
each host's starts, stops, gates and commits, so the order is asserted exactly: drained before
the stop, put back only after the pass and the commit (or on its incumbent after a failure).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers_deploy import CANDIDATE, INCUMBENT, PATHS, FakeGate, state
from helpers_fleet import (
    GATEWAY_SPEC,
    fake_fleet,
    fleet_gateway,
    fleet_stack,
    revive,
    rollout,
)

from stackbuild.gate.result import GateResult
from stackbuild.host import units
from stackbuild.host.gateway import POOL_SCRIPT
from stackbuild.host.state import ACQUIRE_SCRIPT
from stackbuild.render.gateway import pool_file, pool_urls
from stackbuild.spec.stack import Stack
from stackbuild.testing.fake_gateway import FakeGateway
from stackbuild.testing.fake_host import FakeHost, Killed

MAIN, CAND = PATHS.main_unit, PATHS.candidate_unit
URL = {"h0": "http://127.0.0.1", "h1": "http://h1", "h2": "http://h2"}  # as the gateway on h0 reaches them


def traced(fakes: dict[str, FakeHost], gw: FakeGateway) -> tuple[list[str], Callable[[str, list[str]], bool]]:
    """The timeline (the gateway's calls land in it too) and the client: one request per host command,
    once the gateway serves, and a line for each start, stop and commit."""
    timeline: list[str] = []
    gw.calls = timeline

    def on_command(address: str, argv: list[str]) -> bool:
        host = address.removeprefix("root@")
        if argv[:2] in (["systemctl", "start"], ["systemctl", "stop"]) and len(argv) == 3:
            timeline.append(f"{host} {argv[1]} {argv[2]}")
        elif argv[:3] == ["sh", "-c", units.COMMIT_SCRIPT]:
            timeline.append(f"{host} commit {argv[7]}")
        if gw.up():
            gw.send()
        return False

    return timeline, on_command


def gates(fakes: dict[str, FakeHost], timeline: list[str], fail: set[str] = frozenset()) -> dict[str, Any]:  # type: ignore[assignment]
    """Each host's gate, on the timeline: the verdict `fail` for the candidate on the hosts named."""
    out = {}
    for name, f in fakes.items():
        inner = FakeGate(f, verdicts={CANDIDATE: "fail"} if name in fail else {})

        def gate(url: str, *a: Any, _name: str = name, _inner: FakeGate = inner) -> GateResult:
            timeline.append(f"{_name} gate {_inner.host.serving(int(url.rsplit(':', 1)[1])) or 'nothing'}")
            return _inner(url, *a)

        out[name] = gate
    return out


def of(timeline: list[str], host: str) -> list[str]:
    """The timeline of one host's server: its own lines (not the gateway unit's, on h0) and the gateway's
    calls for its URLs."""
    return [e for e in timeline if (e.startswith(f"{host} ") and GATEWAY_SPEC.service not in e)
            or URL[host] + ":" in e]


def story(tmp: Path, stack: Stack, fail: frozenset[str] = frozenset(), request_s: float = 2.0
          ) -> tuple[dict[str, FakeHost], FakeGateway, list[str], int]:
    """One rollout of `stack` on a fresh fake fleet behind its gateway, traced: (fakes, gateway, timeline, exit)."""
    fakes = fake_fleet()
    gw = fleet_gateway(fakes, request_s=request_s)
    timeline, client = traced(fakes, gw)
    run = rollout(fakes, stack, tmp, gates(fakes, timeline, fail=set(fail)), die_before=client, gw=gw)
    return fakes, gw, timeline, run.code if run.code is not None else -1


def pool(fakes: dict[str, FakeHost], gw: FakeGateway) -> tuple[list[str], list[str]]:
    """(the gateway's routable workers, the URLs its unit's pool file names on h0)."""
    return (sorted(w.url for w in gw.workers() if w.routable),
            sorted(pool_urls(fakes["h0"].files.get(pool_file(GATEWAY_SPEC)))))


@pytest.mark.parametrize("strategy", ["swap", "side-by-side"])
def test_a_rolled_back_canary_and_a_promoted_candidate_drop_no_request(tmp_path: Path, strategy: str) -> None:
    fakes = fake_fleet()
    gw = fleet_gateway(fakes)
    timeline, client = traced(fakes, gw)
    stack = fleet_stack(strategy)
    first = rollout(fakes, stack, tmp_path, gates(fakes, timeline, fail={"h0"}), die_before=client, gw=gw)
    assert first.code == 1, "\n".join(first.out)
    assert [state(f).current.image for f in fakes.values()] == [INCUMBENT] * 3  # type: ignore[union-attr]
    # h1 and h2 untouched: only put in the gateway's pool when it came up (they serve)
    assert of(timeline, "h1") + of(timeline, "h2") == ["add http://h1:31000", "add http://h2:31000"]
    assert pool(fakes, gw) == ([f"{URL[h]}:31000" for h in fakes],) * 2
    second = rollout(fakes, stack, tmp_path, gates(fakes, timeline), die_before=client, gw=gw)
    assert second.code == 0, "\n".join(second.out)
    port = 31000 if strategy == "swap" else 31001  # side-by-side: each candidate took over where it ran
    assert [(state(f).current.image, state(f).current.port) for f in fakes.values()] == [(CANDIDATE, port)] * 3  # type: ignore[union-attr]
    assert pool(fakes, gw) == ([f"{URL[h]}:{port}" for h in fakes],) * 2
    assert (gw.failed, gw.failures) == (0, []) and gw.sent >= 50, gw.sent


def test_swap_drains_before_the_stop_and_puts_back_after_the_pass_and_the_commit(tmp_path: Path) -> None:
    _, gw, timeline, code = story(tmp_path, fleet_stack("swap"))
    assert code == 0
    assert of(timeline, "h1") == [
        "add http://h1:31000",  # the gateway came up: every serving host in its pool
        "remove http://h1:31000",  # the rollout drains the host: out of the pool, nothing left in flight
        "remove http://h1:31000",  # the deploy's own drain before it stops the incumbent: out already
        f"h1 stop {MAIN}", f"h1 start {MAIN}",
        f"h1 gate {CANDIDATE}",  # gated directly, out of the pool
        f"h1 commit {MAIN}",
        "add http://h1:31000",  # back only once it passed, committed and serves
        "add http://h1:31000",  # the rollout makes sure: in already, nothing changes
    ]
    assert (gw.failed, gw.failures) == (0, [])


def test_side_by_side_joins_the_candidate_where_it_runs_then_drains_and_stops_the_incumbent(tmp_path: Path) -> None:
    _, gw, timeline, code = story(tmp_path, fleet_stack("side-by-side"))
    assert code == 0
    assert of(timeline, "h1") == [
        "add http://h1:31000", "remove http://h1:31000",
        "remove http://h1:31001",  # no stale entry for the candidate's port before it starts there
        f"h1 start {CAND}", f"h1 gate {CANDIDATE}",
        "add http://h1:31001",  # it passed: into the pool on the staging port, where it runs
        "remove http://h1:31000", f"h1 stop {MAIN}",  # the incumbent, out of the pool already, stops
        f"h1 commit {CAND}",  # committed on the unit it runs as: nothing restarted
        "add http://h1:31001",
    ]
    assert (gw.failed, gw.failures) == (0, [])


def test_a_failed_canary_goes_back_on_its_incumbent_and_into_the_gateway(tmp_path: Path) -> None:
    fakes, gw, timeline, code = story(tmp_path, fleet_stack("swap"), fail=frozenset({"h0"}))
    assert code == 1
    assert of(timeline, "h0") == [
        "add http://127.0.0.1:31000", "remove http://127.0.0.1:31000", "remove http://127.0.0.1:31000",
        f"h0 stop {MAIN}", f"h0 start {MAIN}", f"h0 gate {CANDIDATE}",
        # the restore drains what it stops (the rejected candidate was never in) and restarts the incumbent,
        "remove http://127.0.0.1:31000", f"h0 stop {MAIN}", f"h0 start {MAIN}", f"h0 commit {MAIN}",
        "add http://127.0.0.1:31000",  # serving again: back in
        "remove http://127.0.0.1:31001",  # then the other unit, if anything ran there, goes
        "add http://127.0.0.1:31000",
    ]
    assert fakes["h0"].serving(31000) == INCUMBENT
    assert (gw.failed, gw.failures) == (0, [])


def test_a_drain_that_does_not_end_puts_the_host_back_and_stops_the_rollout_exit_4(tmp_path: Path) -> None:
    fakes = fake_fleet()
    gw = fleet_gateway(fakes, request_s=1e6)  # every request runs for ever: no server ever empties
    timeline, client = traced(fakes, gw)
    run = rollout(fakes, fleet_stack("swap"), tmp_path, gates(fakes, timeline), die_before=client, gw=gw)
    out = "\n".join(run.out)
    assert run.code == 4, out
    assert "drain of http://127.0.0.1:31000 from the gateway http://127.0.0.1:31080 did not finish" in out
    # drained, then back in when it did not empty in time; its server never stopped
    assert of(timeline, "h0") == ["add http://127.0.0.1:31000", "remove http://127.0.0.1:31000",
                                  "add http://127.0.0.1:31000",
                                  "add http://127.0.0.1:31000"]  # the rollout makes sure: in already
    assert state(fakes["h0"]).current.image == INCUMBENT and state(fakes["h0"]).pending is None  # type: ignore[union-attr]
    assert pool(fakes, gw) == ([f"{URL[h]}:31000" for h in fakes],) * 2
    assert gw.failed == 0


def test_a_rollout_killed_once_a_host_is_drained_puts_it_back_first_when_run_again(tmp_path: Path) -> None:
    fakes = fake_fleet()
    gw = fleet_gateway(fakes)
    timeline, client = traced(fakes, gw)
    stack = fleet_stack("swap")

    def die(address: str, argv: list[str]) -> bool:  # h1 drained; its deploy about to take the host lease
        client(address, argv)
        return address == "root@h1" and argv[:3] == ["sh", "-c", ACQUIRE_SCRIPT] and '"deploy sim' in argv[-1]

    with pytest.raises(Killed):
        rollout(fakes, stack, tmp_path, gates(fakes, timeline), die_before=die, gw=gw)
    revive(fakes)
    assert fakes["h1"].serving(31000) == INCUMBENT  # never stopped, but out of the pool and of its file
    assert pool(fakes, gw) == (["http://127.0.0.1:31000", "http://h2:31000"],) * 2
    # the gateway restarts meanwhile: it starts with what its pool file names, without the drained host
    again = fleet_gateway(fakes).start(*pool_urls(fakes["h0"].files[pool_file(GATEWAY_SPEC)]))
    timeline2, client2 = traced(fakes, again)
    run = rollout(fakes, stack, tmp_path, gates(fakes, timeline2), die_before=client2, gw=again)
    assert run.code == 0, "\n".join(run.out)
    h1 = of(timeline2, "h1")
    assert h1[0] == "add http://h1:31000" and h1.index("add http://h1:31000") < h1.index(f"h1 stop {MAIN}")
    assert pool(fakes, again) == ([f"{URL[h]}:31000" for h in fakes],) * 2
    assert (gw.failed, again.failed) == (0, 0)


def test_a_rollout_killed_mid_drain_leaves_the_pool_file_without_the_host_and_the_rerun_puts_it_back(
        tmp_path: Path) -> None:
    fakes = fake_fleet()
    gw = fleet_gateway(fakes)
    timeline, client = traced(fakes, gw)
    stack = fleet_stack("side-by-side")

    def die(address: str, argv: list[str]) -> bool:  # h1's drain began: out of the pool file, not yet the pool
        return address == "root@h0" and argv[:3] == ["sh", "-c", POOL_SCRIPT] and argv[-1] == "-http://h1:31000"

    with pytest.raises(Killed):
        rollout(fakes, stack, tmp_path, gates(fakes, timeline), die_before=client, die_after=die, gw=gw)
    revive(fakes)
    routed, named = pool(fakes, gw)
    # the canary took over on its staging port; h1 still routed to, but a restart would start without it
    assert (routed, named) == (["http://127.0.0.1:31001", "http://h1:31000", "http://h2:31000"],
                               ["http://127.0.0.1:31001", "http://h2:31000"])
    timeline2, client2 = traced(fakes, gw)
    run = rollout(fakes, stack, tmp_path, gates(fakes, timeline2), die_before=client2, gw=gw)
    assert run.code == 0, "\n".join(run.out)
    assert of(timeline2, "h1")[0] == "add http://h1:31000"  # the gateway's pool file names it again first
    assert pool(fakes, gw) == ([f"{URL[h]}:31001" for h in fakes],) * 2
    assert (gw.failed, gw.failures) == (0, [])


def test_a_wave_taken_back_is_drained_before_each_host_stops(tmp_path: Path) -> None:
    stack = fleet_stack("swap", waves=(1, "100%"))
    stack = stack.model_copy(update={"host": stack.host.model_copy(update={
        "fleet": stack.host.fleet.model_copy(update={"on_failure": "rollback_all"})})})
    fakes, gw, timeline, code = story(tmp_path, stack, fail=frozenset({"h2"}))
    assert code == 1
    for host in ("h0", "h1"):  # promoted, then taken back with the wave that failed
        back = of(timeline, host)[of(timeline, host).index(f"{host} commit {MAIN}") + 1:]
        port, spare = f"{URL[host]}:31000", f"{URL[host]}:31001"
        assert back == ["add " + port, "add " + port,  # promoted: back in
                        # taken back: drained before the stop, back in once the incumbent serves
                        "remove " + port, f"{host} stop {MAIN}", f"{host} start {MAIN}",
                        f"{host} commit {MAIN}", "add " + port, "remove " + spare]
        assert state(fakes[host]).current.image == INCUMBENT  # type: ignore[union-attr]
    assert (gw.failed, gw.failures) == (0, [])


def test_a_gateway_port_another_process_holds_refuses_the_rollout_before_any_server_changes(tmp_path: Path) -> None:
    fakes = fake_fleet()
    fakes["h0"].strangers.add(GATEWAY_SPEC.port)
    gw = fleet_gateway(fakes)
    timeline, client = traced(fakes, gw)
    run = rollout(fakes, fleet_stack("swap"), tmp_path, gates(fakes, timeline), die_before=client, gw=gw)
    assert run.code == 4
    assert (": refused (exit 4): gateway: root@h0: cannot run the gateway there: port 31080 (gateway.port) is in use "
            "by another process: free it or change gateway.port; no server was changed; every step in ") in run.out[-1]
    assert [state(f).current.image for f in fakes.values()] == [INCUMBENT] * 3  # type: ignore[union-attr]
    assert not [e for e in timeline if " stop " in e or " start " in e]


def test_a_gateway_lost_mid_drain_is_named_in_the_summary_and_the_next_run_puts_the_host_back(
        tmp_path: Path) -> None:
    """The smg container killed during h1's drain and gone for the rest of the run: h1 serves but is out of
    the pool (and of its file). Never silent: its row and the summary say so, exit 4; the next run (the
    gateway back, started from its pool file) puts it back."""
    fakes = fake_fleet()
    gw = fleet_gateway(fakes)
    timeline, client = traced(fakes, gw)
    stack = fleet_stack("side-by-side")
    lost = [False]
    alive = gw.up
    gw.up = lambda: not lost[0] and alive()

    def kill_gateway(address: str, argv: list[str]) -> bool:  # h1's drain began: out of the pool file
        if address == "root@h0" and argv[:3] == ["sh", "-c", POOL_SCRIPT] and argv[-1] == "-http://h1:31000":
            lost[0] = True
        return False

    run = rollout(fakes, stack, tmp_path, gates(fakes, timeline), die_before=client, die_after=kill_gateway, gw=gw)
    assert run.code == 4, "\n".join(run.out)
    said = "\n".join(run.out)
    assert "| h1 | 1 | refused |  |  | NOT in the gateway (serving); GET http://127.0.0.1:31080/workers" in said
    assert ("; NOT in the gateway though serving: h1 (the gateway at http://127.0.0.1:31080 does not answer after "
            "60s") in said and "the next rollout puts them back" in said
    assert fakes["h1"].serving(31000) == INCUMBENT and "http://h1:31000" not in pool_urls(
        fakes["h0"].files[pool_file(GATEWAY_SPEC)])
    # the gateway comes back (its unit restarted): it starts with its pool file, without h1; the next run
    # puts h1 back before it touches anything
    again = fleet_gateway(fakes).start(*pool_urls(fakes["h0"].files[pool_file(GATEWAY_SPEC)]))
    again.key = gw.key
    timeline2, client2 = traced(fakes, again)
    rerun = rollout(fakes, stack, tmp_path, gates(fakes, timeline2), die_before=client2, gw=again)
    assert rerun.code == 0, "\n".join(rerun.out)
    assert of(timeline2, "h1")[0] == "add http://h1:31000"
    assert pool(fakes, again) == ([f"{URL[h]}:31001" for h in fakes],) * 2
    assert (again.failed, again.failures) == (0, [])
