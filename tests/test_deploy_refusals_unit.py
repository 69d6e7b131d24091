"""Refusals, lost connections, interrupted runs and the channel move, on the scripted FakeHost."""

from __future__ import annotations

import time

import pytest
from helpers_deploy import (
    CANDIDATE,
    D_INC,
    INCUMBENT,
    MAIN,
    PATHS,
    PORT,
    STAGING,
    Sleeps,
    request,
    run,
    services,
    settled,
    snapshot,
    state,
    steps,
    unit_text,
    with_incumbent,
)

from stackbuild.errors import InfraError
from stackbuild.host import units
from stackbuild.host.deploy import CHANNEL_TRIES, deploy, recover
from stackbuild.host.dryrun import DryRunRemote
from stackbuild.host.preflight import DOCKER_INFO
from stackbuild.host.ssh import sh_argv
from stackbuild.host.state import HostState, LeaseOwner, Pending, write_state
from stackbuild.host.unit_probe import POLL_SCRIPT


def test_preflight_failure_lists_every_check_and_changes_nothing() -> None:
    host = with_incumbent()
    host.docker_version = None
    host.free_kib = 512 * 1024
    host.strangers = {STAGING}
    before = snapshot(host)
    rep = run(host, "side-by-side")
    assert (rep.outcome, rep.exit_code) == ("refused", 4)
    assert steps(rep) == [("lock", True), ("state", True), ("preflight", False)]
    assert rep.cause == (
        f"preflight failed on {host.address} (3 problems): docker: docker is not usable: Cannot connect to the Docker "
        "daemon at unix:///var/run/docker.sock.; install/start it; disk: 0.5 GiB free under /var/lib/docker, "
        f"the image needs 1.0 GiB; port: port {STAGING} is in use by another process: free it or change runtime.port"
        f"\n  - docker: docker is not usable: Cannot connect to the Docker daemon at unix:///var/run/docker.sock.; "
        "install/start it\n  - disk: 0.5 GiB free under /var/lib/docker, the image needs 1.0 GiB"
        f"\n  - port: port {STAGING} is in use by another process: free it or change runtime.port"
    )
    assert snapshot(host) == before
    assert not [c for c in host.commands if c[0] in ("docker", "<put>") and c[:2] != ["docker", "info"]
                and c[:3] != ["docker", "image", "inspect"]]  # nothing pulled, nothing written


def test_swap_preflight_accepts_the_port_the_incumbent_holds() -> None:
    host = with_incumbent()
    rep = run(host)
    assert rep.exit_code == 0
    assert f"port: port {PORT} is held by the incumbent (replaced on promotion)" in rep.steps[2].detail


def test_lock_held_elsewhere_refused_and_nothing_changed() -> None:
    host = with_incumbent()
    owner = LeaseOwner("other-box", 1, time.time() - 5, "deploy x", time.time() + 600)
    host.dirs[PATHS.lease_dir] = host.now
    host.files[f"{PATHS.lease_dir}/owner.json"] = owner.to_json()
    before = snapshot(host)
    rep = run(host)
    assert (rep.outcome, rep.exit_code, steps(rep)) == ("refused", 4, [("lock", False)])
    assert rep.cause is not None and rep.cause.startswith(
        f"{host.address}: another deploy holds the host lease (deploy x by pid 1 on other-box, started ")
    assert snapshot(host) == before
    assert len(host.commands) == 1  # the one mkdir that failed


def test_pull_failure_refused_and_nothing_changed() -> None:
    host = with_incumbent()
    host.registry.discard(CANDIDATE)
    before = snapshot(host)
    rep = run(host)
    assert (rep.outcome, rep.exit_code, steps(rep)[-1]) == ("refused", 4, ("pull", False))
    assert rep.cause is not None and rep.cause.splitlines()[0] == (
        f"{host.address}: cannot pull {CANDIDATE} (registry unreachable or image missing); "
        "nothing on the host was changed: check the registry and re-run")
    assert snapshot(host) == before


def test_connection_lost_mid_deploy_then_recover_converges() -> None:
    host = with_incumbent()
    before = settled(state(host))
    host.drop_when(lambda a: a == sh_argv(POLL_SCRIPT, MAIN))  # while the candidate loads, the incumbent stopped
    req, svc = request(), services(host)
    rep = deploy(host, req, svc)
    assert (rep.outcome, rep.exit_code, rep.needs_recovery) == ("failed", 4, True)
    assert rep.cause is not None and rep.cause.splitlines()[0] == f"{host.address}: connection lost (scripted)"
    assert steps(rep)[-1] == ("ready", False)
    # as the dead connection left it: the candidate in place of the incumbent, pending, the lock held
    assert host.closed  # a lost connection stays lost: look at the host out of band
    pending = HostState.model_validate_json(host.files[PATHS.state_file]).pending
    assert pending is not None and (pending.op, pending.image, pending.strategy) == ("deploy", CANDIDATE, "swap")
    assert PATHS.lease_dir in host.dirs and host.running[MAIN].image == CANDIDATE

    # this run's own lock (its run id, not merely this pid), over the new connection, is ours to take back
    recover(host.reconnect(), req, svc, rep)
    assert rep.needs_recovery is False
    assert [n for n, _ in steps(rep)[-2:]] == ["restore", "verify serving"]
    assert settled(state(host)) == before  # pending cleared, current as it was
    assert host.serving(PORT) == INCUMBENT and PATHS.lease_dir not in host.dirs


def test_recover_with_nothing_pending_says_so_and_frees_the_lock() -> None:
    host = with_incumbent()
    rep = run(host)
    recover(host.reconnect(), request(), services(host), rep)
    assert rep.steps[-1].name == "recover" and rep.steps[-1].detail == "nothing pending"
    assert PATHS.lease_dir not in host.dirs


def test_a_killed_deploys_pending_marker_is_converged_first_then_the_deploy_proceeds() -> None:
    host = with_incumbent()
    # as a deploy killed mid-swap left it: its candidate's unit installed, pending marked, a lock past its bound
    dead = LeaseOwner("other-box", 999, time.time() - 7200, "deploy sim", time.time() - 60)
    host.dirs[PATHS.lease_dir] = host.now
    host.files[f"{PATHS.lease_dir}/owner.json"] = dead.to_json()
    write_state(host, PATHS, state(host).model_copy(update={"pending": Pending(
        op="deploy", image=CANDIDATE, strategy="swap", owner=dead.to_json(), started_at="2026-01-01T00:00:00Z")}))
    host.files["/srv/killed.service"] = unit_text(CANDIDATE)
    host.dirs["/srv"] = host.now
    units.stop(host, MAIN)
    units.install(host, "/srv/killed.service", PATHS.unit_path(MAIN))
    units.start(host, MAIN)
    rep = run(host)
    assert (rep.outcome, rep.exit_code) == ("promoted", 0)
    # the restore's own steps end inside "recover"
    assert [n for n, _ in steps(rep)[:6]] == ["lock", "state", "restore", "verify serving", "recover", "preflight"]
    assert rep.steps[0].detail == "broke a stale lock (deploy sim)"
    assert rep.steps[4].detail == f"an interrupted deploy of {CANDIDATE} was pending"
    assert rep.steps[2].detail == f"reinstalled and started {INCUMBENT}"
    after = settled(state(host))
    assert (after["previous"]["digest"], after["current"]["image"], after["pending"]) == (D_INC, CANDIDATE, None)
    stale = [d for d in host.dirs if d.startswith(PATHS.lease_dir + ".stale.")]
    assert len(stale) == 1 and host.files[f"{stale[0]}/owner.json"] == dead.to_json()


class Registry:
    def __init__(self, fail: int) -> None:
        self.fail, self.calls = fail, 0

    def __call__(self, ref: str) -> str:
        self.calls += 1
        if self.calls <= self.fail:
            raise InfraError("PUT manifest: HTTP 503 Service Unavailable")
        return f"stable -> {ref}"


def test_channel_that_will_not_move_keeps_the_promotion_and_says_how() -> None:
    host = with_incumbent()
    sleeps, registry = Sleeps(host), Registry(fail=10)
    rep = run(host, promote_channel=registry, sleep=sleeps)
    assert (rep.outcome, rep.exit_code, rep.verdict) == ("promoted", 4, "pass")
    assert registry.calls == CHANNEL_TRIES and sleeps.slept == [2.0, 4.0]
    assert steps(rep)[-2:] == [("promote", True), ("channel", False)]
    assert rep.steps[-1].detail == "not moved after 3 tries: PUT manifest: HTTP 503 Service Unavailable"
    assert rep.cause == (
        "promoted and committed on the host, but the channel 'stable' is stale (registry: PUT manifest: HTTP 503 "
        f"Service Unavailable); move it when the registry is back: stackbuild promote {CANDIDATE} --channel stable"
    )
    st = settled(state(host))
    assert (st["current"]["image"], st["pending"]) == (CANDIDATE, None) and host.serving(PORT) == CANDIDATE


def test_channel_moved_on_a_retry() -> None:
    host = with_incumbent()
    sleeps, registry = Sleeps(host), Registry(fail=1)
    rep = run(host, promote_channel=registry, sleep=sleeps)
    assert (rep.outcome, rep.exit_code, rep.cause) == ("promoted", 0, None)
    assert (registry.calls, sleeps.slept, rep.steps[-1].detail) == (2, [2.0], f"stable -> {CANDIDATE}")


@pytest.mark.parametrize("strategy", ["swap", "side-by-side"])
def test_dry_run_reads_the_host_and_changes_nothing(strategy: str) -> None:
    host = with_incumbent()
    before = snapshot(host)
    said: list[str] = []
    svc = services(host, echo=said.append)
    rep = deploy(DryRunRemote(host.address, reader=host, echo=said.append), request(strategy), svc)
    assert (rep.outcome, rep.exit_code) == ("planned", 0)
    assert snapshot(host) == before
    unit = MAIN if strategy == "swap" else "stackbuild-sim-candidate.service"
    assert f"would run: systemctl start {unit}" in said
    assert ("would stop the incumbent stackbuild-sim.service" in said) is (strategy == "swap")
    assert f"would promote (write {PATHS.state_file}) or roll back to the incumbent" in said
    # the reads went to the host: the plan is the one a real run would follow here
    assert ["systemctl", "is-active", MAIN] in host.commands and ["docker", "info", *DOCKER_INFO[2:]] in host.commands
