"""The gateway's unit on its host (host/gateway.py) on the scripted FakeHost: preflight of its ports, the unit
brought up to date (installed once, left alone unchanged, restarted when it changed), its pool file edited
one URL at a time, its record, `status --host` reading its workers, a reboot; and the swap's outage
estimate from the ledger (results/outage.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_deploy import PATHS, REPO, run, sim_stack, state, with_incumbent
from helpers_fleet import GATEWAY_SPEC, GW_IMAGE, FakeReach, gateway_on
from test_gateway_deploy_unit import behind_gateway

from stackbuild.errors import InfraError
from stackbuild.flows.deploy_host import read_status
from stackbuild.host import gateway
from stackbuild.host.ssh import SshOptions, sh_argv
from stackbuild.render.gateway import pool_file, pool_text, render_gateway_unit
from stackbuild.results.ledger import Ledger
from stackbuild.results.outage import swap_outage
from stackbuild.testing.fake_host import SERVES, FakeHost

UNIT = f"{GATEWAY_SPEC.service}.service"
GP = gateway.gateway_paths(sim_stack())
POOL = pool_file(GATEWAY_SPEC)
NEWER = f"{REPO}@sha256:" + "8" * 64


def gateway_host() -> FakeHost:
    host = with_incumbent()
    host.registry |= {GW_IMAGE, NEWER}
    host.servers[GW_IMAGE] = host.servers[NEWER] = SERVES
    return host


def test_ensure_installs_the_unit_once_leaves_it_alone_then_restarts_it_when_it_changed() -> None:
    host = gateway_host()
    said = gateway.ensure(host, sim_stack(), GW_IMAGE, ["http://127.0.0.1:31000"], pull_timeout_s=60)
    assert said == f"{UNIT} started with {GW_IMAGE} (pulled)"
    assert host.files[GP.unit_path(UNIT)] == render_gateway_unit(sim_stack(), image=GW_IMAGE)
    assert host.enabled[UNIT] == GP.unit_path(UNIT) and host.state_of(UNIT) == "active"
    assert host.files[POOL] == pool_text(["http://127.0.0.1:31000"])  # what it starts with
    rec = gateway.records(host, PATHS.state_dir)
    assert [(r.service, r.image, r.port, r.stack) for r in rec] == [(GATEWAY_SPEC.service, GW_IMAGE, 31080, "sim")]
    assert GP.lease_dir not in host.dirs  # its lock released
    started = host.running[UNIT].started_at
    host.sleep(10.0)
    host.commands.clear()
    # unchanged: nothing restarts, and its pool (edited since) is not reset
    gateway.edit_pool(host, GATEWAY_SPEC, ["http://h1:31000"], ["http://127.0.0.1:31000"])
    said = gateway.ensure(host, sim_stack(), GW_IMAGE, [], pull_timeout_s=60)
    assert said == f"{UNIT} runs sha256:999999999999 (unchanged)"
    assert host.running[UNIT].started_at == started and host.files[POOL] == pool_text(["http://h1:31000"])
    assert not [c for c in host.commands if c[:2] in (["systemctl", "stop"], ["systemctl", "start"])]
    # another image: installed and restarted in place
    assert gateway.ensure(host, sim_stack(), NEWER, [], pull_timeout_s=60) == f"{UNIT} restarted with {NEWER} (pulled)"
    assert host.running[UNIT].image == NEWER and host.running[UNIT].started_at > started
    # it starts on boot, with what its pool file names
    host.reboot()
    host.sleep(5.0)
    assert host.serving(31080) == NEWER and host.files[POOL] == pool_text(["http://h1:31000"])


def test_the_pool_file_is_edited_one_url_at_a_time_under_a_host_side_lock() -> None:
    host = gateway_host()
    gateway.edit_pool(host, GATEWAY_SPEC, ["http://a:1", "http://b:2"], [])
    gateway.edit_pool(host, GATEWAY_SPEC, ["http://c:3", "http://a:1"], ["http://b:2"])
    assert host.files[POOL] == pool_text(["http://c:3", "http://a:1"])
    assert host.commands[-1] == sh_argv(gateway.POOL_SCRIPT, POOL, "-http://b:2", "+http://c:3", "+http://a:1")
    n = len(host.commands)
    gateway.edit_pool(host, GATEWAY_SPEC, [], [])  # nothing to change: nothing sent
    assert len(host.commands) == n


def test_preflight_of_the_gateway_host_names_a_port_another_process_holds() -> None:
    host = gateway_host()
    assert [c.ok for c in gateway.checks(host, sim_stack())] == [True, True]
    host.strangers.add(GATEWAY_SPEC.metrics_port)
    assert [(c.ok, c.detail) for c in gateway.checks(host, sim_stack())] == [
        (True, "port 31080 is free"),
        (False, "port 31089 (gateway.metrics_port) is in use by another process: free it or change "
                "gateway.metrics_port")]
    host.strangers.clear()
    gateway.ensure(host, sim_stack(), GW_IMAGE, [], pull_timeout_s=60)
    host.sleep(3.0)
    assert gateway.checks(host, sim_stack())[0].detail == f"port 31080 is held by {UNIT}"


def test_status_of_the_host_shows_its_gateway_and_each_worker(tmp_path: Path) -> None:
    host = gateway_host()
    gateway.ensure(host, sim_stack(), GW_IMAGE, ["http://127.0.0.1:31000"], pull_timeout_s=60)
    host.sleep(3.0)
    reach = FakeReach({"127.0.0.1": host}, gw=gateway_on(host, lambda _name: host))  # loopback: no tunnel
    _, st = read_status("root@127.0.0.1", SshOptions(), service=None, state_dir=PATHS.state_dir, reach=reach)
    assert st.render("root@127.0.0.1").splitlines()[-2:] == [
        f"  gateway {GATEWAY_SPEC.service} on port 31080 (sha256:999999999999): 1 worker(s)",
        "    http://127.0.0.1:31000: ready, 0 in flight"]
    host.running.pop(UNIT)  # the gateway's process is gone
    _, st = read_status("root@127.0.0.1", SshOptions(), service=None, state_dir=PATHS.state_dir, reach=reach)
    assert st.gateways == (f"  gateway {GATEWAY_SPEC.service} on port 31080 (sha256:999999999999): NOT answering "
                           "(GET http://127.0.0.1:31080/workers: no answer (ConnectionRefusedError: refused))",)
    assert st.active and st.unit == PATHS.main_unit  # the server's own status is read as before


def test_a_swaps_outage_is_estimated_from_the_ledgers_load_times(tmp_path: Path) -> None:
    stack, ledger = sim_stack(), tmp_path / "ledger.db"
    assert swap_outage(ledger, stack) == (
        "swap: the incumbent stops before the candidate starts, so clients get no answer until it serves; the "
        "ledger has no load time of sim yet: the outage lasts as long as the candidate takes to load, at most "
        "120s (runtime.start_timeout_s + ready_timeout_s)")
    with Ledger(ledger) as db:
        for durations, down, stack_name in (
                ({"start": 0.5, "ready": 3.0, "gate": 40.0}, 3.4, "sim"),  # a swap: its measured outage
                ({"start": 0.3, "ready": 2.2, "gate": 30.0}, None, "sim"),  # side-by-side: its load
                ({"start": 0.3, "ready": 9.0}, None, "sim"),  # never ready: not a load time
                ({"start": 0.3, "ready": 2.0, "gate": 1.0, "switch": 0.5}, None, "sim"),  # two loads in "ready"
                ({"start": 0.2, "ready": 50.0, "gate": 1.0}, 50.0, "other")):  # another stack
            db.record_deploy(host="h", stack=stack_name, image="i", strategy="swap", outcome="promoted",
                             durations=durations, downtime_s=down)
    assert swap_outage(ledger, stack) == (
        "swap: the incumbent stops before the candidate starts, so clients get no answer until it serves: about "
        "3.0s (the median of 2 load(s) of sim in the ledger, the longest 3.4s)")


def test_a_gateway_whose_port_another_process_holds_is_not_started_and_the_deploy_is_refused() -> None:
    host = gateway_host()
    host.strangers.add(GATEWAY_SPEC.port)
    _, link = behind_gateway(host)
    before = state_of(host)
    rep = run(host, "side-by-side", gateway=link)
    assert (rep.outcome, rep.exit_code) == ("refused", 4)
    assert rep.cause == ("fake@127.0.0.1: cannot run the gateway there: port 31080 (gateway.port) is in use by "
                         "another process: free it or change gateway.port")
    assert UNIT not in host.running and GP.unit_path(UNIT) not in host.files and state_of(host) == before


def state_of(host: FakeHost) -> tuple[object, ...]:
    return state(host), dict(host.running)


def test_preflight_refuses_data_plane_keys_the_gateway_hosts_secrets_file_lacks() -> None:
    host = gateway_host()
    stack = sim_stack()
    assert stack.gateway is not None
    keyed = stack.model_copy(update={"gateway": stack.gateway.model_copy(update={"api_keys": ("TEAM_A", "TEAM_B")})})
    secrets = f"/etc/stackbuild/{GATEWAY_SPEC.service}.env"
    host.files[secrets] = 'TEAM_A="a-secret"\n'
    assert gateway.checks(host, keyed)[-1].detail == (
        f"gateway.api_keys: TEAM_B not set in {secrets} on {host.address}; write NAME=\"VALUE\" lines there "
        "(mode 0600)")
    with pytest.raises(InfraError) as err:
        gateway.ensure(host, keyed, GW_IMAGE, [], pull_timeout_s=60)
    assert "TEAM_B not set" in str(err.value) and "a-secret" not in str(err.value)
    assert UNIT not in host.running
    host.files[secrets] += 'TEAM_B="b-secret"\n'
    assert gateway.checks(host, keyed)[-1].ok
    gateway.ensure(host, keyed, GW_IMAGE, [], pull_timeout_s=60)
    assert host.state_of(UNIT) == "active"
