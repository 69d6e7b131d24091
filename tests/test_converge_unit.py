"""converge.to_current and rollback on the scripted FakeHost: exact commands, units and state."""

from __future__ import annotations

import pytest
from helpers_deploy import (
    BACKUP,
    CAND_ENV,
    CAND_UNIT,
    CANDIDATE,
    ENV,
    INCUMBENT,
    MAIN,
    OPERATOR_ENV,
    PATHS,
    PORT,
    fake_host,
    run,
    settled,
    sim_stack,
    state,
    unit_text,
    with_incumbent,
)

from stackbuild.errors import InfraError, InputError
from stackbuild.host import converge, secrets, units
from stackbuild.host.outcome import DeployReport
from stackbuild.host.ssh import READ_FILE_SCRIPT, sh_argv
from stackbuild.host.state import HostState
from stackbuild.host.unit_probe import BOOT_PROPERTIES, POLL_SCRIPT, show_argv
from stackbuild.testing.fake_host import NEVER_LISTENS, FakeHost

RESTORE_SECRETS = sh_argv(secrets.RESTORE_SCRIPT, ENV, BACKUP, CAND_ENV)
REMOVE_CAND = sh_argv(units.REMOVE_SCRIPT, CAND_UNIT, *PATHS.files_of("staging"))
REMOVE_SWITCH = sh_argv(units.REMOVE_SCRIPT, PATHS.switch_unit, *PATHS.switch_paths)
SHOW_MAIN = show_argv(MAIN, BOOT_PROPERTIES)
STAGED, STAGED_STATE = f"{PATHS.staging_dir}/{MAIN}", f"{PATHS.staging_dir}/state.json"
COMMIT = sh_argv(units.COMMIT_SCRIPT, STAGED, PATHS.main_path, PATHS.override_path, MAIN, STAGED_STATE,
                 PATHS.state_file, CAND_UNIT, PATHS.unit_path(CAND_UNIT), BACKUP, f"{BACKUP}.absent", CAND_ENV)


def conv(host: FakeHost) -> converge.Converger:
    rep = DeployReport(host=host.address, service=PATHS.service, stack="sim", image="", strategy="swap")
    return converge.converger_for(sim_stack(), host.endpoint, rep, 1800.0, http_probe=host.http_probe,
                                  pace=host.pace(0.5))


def test_incumbent_already_running_is_left_alone() -> None:
    host = with_incumbent()
    started = host.running[MAIN].started_at
    st, c = state(host), conv(host)
    host.commands.clear()
    assert converge.to_current(host, PATHS, st, c) == st
    assert host.commands == [
        REMOVE_CAND, REMOVE_SWITCH, RESTORE_SECRETS,
        SHOW_MAIN, sh_argv(READ_FILE_SCRIPT, PATHS.unit_path(MAIN)),
        sh_argv(POLL_SCRIPT, MAIN),  # serving at the first poll
        ["mkdir", "-p", PATHS.base], ["<put>", PATHS.state_file, "0644"],
    ]
    assert host.running[MAIN].started_at == started and c.report.outages == []
    assert [(s.name, s.detail) for s in c.report.steps] == [
        ("restore", f"{MAIN} already runs {INCUMBENT}"), ("verify serving", "ready: generated ' Hello there'")]


def test_unit_text_that_differs_is_reinstalled_and_the_outage_timed() -> None:
    host = with_incumbent()
    host.files[PATHS.unit_path(MAIN)] += "# edited on the host\n"
    st, c = state(host), conv(host)
    t0 = host.now
    host.commands.clear()
    converge.to_current(host, PATHS, st, c)
    poll = sh_argv(POLL_SCRIPT, MAIN)
    assert host.commands == [
        REMOVE_CAND, REMOVE_SWITCH, RESTORE_SECRETS,
        SHOW_MAIN, sh_argv(READ_FILE_SCRIPT, PATHS.unit_path(MAIN)),
        ["systemctl", "stop", MAIN], ["docker", "image", "inspect", "--format", "{{.Id}}", INCUMBENT],
        # it runs from the /run override until it serves, then the commit makes it the /etc unit again
        ["mkdir", "-p", PATHS.staging_dir], ["<put>", STAGED, "0644"],
        sh_argv(units.INSTALL_SCRIPT, STAGED, PATHS.override_path),
        ["systemctl", "reset-failed", MAIN], ["systemctl", "start", MAIN],
        poll, poll, poll, poll, poll,
        ["<put>", STAGED_STATE, "0644"], COMMIT,
    ]
    assert host.files[PATHS.unit_path(MAIN)] == unit_text(INCUMBENT)
    assert host.serving(PORT) == INCUMBENT and c.report.outages == [(t0, t0 + 2.0)]
    assert host.enabled == {MAIN: PATHS.main_path} and PATHS.override_path not in host.files


def test_no_incumbent_removes_the_candidate_and_nothing_runs() -> None:
    host = fake_host(candidate=NEVER_LISTENS)
    rep = run(host)  # a first deploy whose candidate never served: rolled back to nothing
    assert (rep.outcome, rep.exit_code) == ("rolled-back", 1)
    assert [(s.name, s.detail) for s in rep.steps[-1:]] == [
        ("restore", "no incumbent: candidate removed, nothing else was running")]
    assert host.running == {} and PATHS.unit_path(MAIN) not in host.files and MAIN not in host.loaded
    assert settled(state(host))["current"] is None and state(host).pending is None
    restore = host.commands.index(REMOVE_CAND)
    assert host.commands[restore:restore + 6] == [
        REMOVE_CAND, REMOVE_SWITCH, RESTORE_SECRETS,
        sh_argv(units.REMOVE_SCRIPT, MAIN, *PATHS.files_of("main")),
        ["mkdir", "-p", PATHS.base], ["<put>", PATHS.state_file, "0644"]]
    assert host.enabled == {} and not [f for f in host.files if f.startswith(("/etc/systemd", "/run/"))]


def test_the_operators_secrets_file_is_put_back_before_the_incumbent_restarts() -> None:
    host = with_incumbent(env=OPERATOR_ENV)
    secrets.stage(host, PATHS, ("HF_TOKEN",), {"HF_TOKEN": "candidate"}, target=ENV)
    secrets.stage(host, PATHS, ("HF_TOKEN",), {"HF_TOKEN": "candidate"}, target=CAND_ENV)
    assert host.files[BACKUP] == OPERATOR_ENV and host.files[ENV] != OPERATOR_ENV and CAND_ENV in host.files
    host.files[PATHS.unit_path(MAIN)] += "# differs: the incumbent restarts\n"
    converge.to_current(host, PATHS, state(host), conv(host))
    assert (host.files[ENV], host.modes[ENV]) == (OPERATOR_ENV, 0o600)
    assert not {BACKUP, CAND_ENV} & host.files.keys()
    assert host.running[MAIN].env == {"HF_TOKEN": "operator-value"}


def test_rollback_makes_the_previous_release_current_again() -> None:
    host = with_incumbent()
    assert run(host).exit_code == 0
    promoted = state(host)
    c = conv(host)
    done = converge.rollback(host, PATHS, c, lease_ttl_s=900)
    assert promoted.current is not None and promoted.previous is not None
    assert (done.current, done.previous, done.pending) == (promoted.previous, promoted.current, None)
    assert (done.last_verdict, done.last_cause, done.last_image) == ("rollback", "manual rollback", INCUMBENT)
    assert state(host) == done
    assert host.files[PATHS.unit_path(MAIN)] == unit_text(INCUMBENT) and host.serving(PORT) == INCUMBENT
    assert (c.report.outcome, c.report.exit_code, c.report.image) == ("rolled-back", 0, INCUMBENT)
    assert c.report.downtime_s == 2.0 and PATHS.lease_dir not in host.dirs


def test_rollback_without_a_previous_release_is_an_input_error() -> None:
    host = with_incumbent()
    before = state(host)
    with pytest.raises(InputError, match="has no previous release to roll back to"):
        converge.rollback(host, PATHS, conv(host), lease_ttl_s=900)
    assert state(host) == before and PATHS.lease_dir not in host.dirs


def test_a_restore_whose_incumbent_will_not_serve_is_an_infra_error_naming_journalctl() -> None:
    host = with_incumbent()
    assert run(host).exit_code == 0
    host.servers[INCUMBENT] = NEVER_LISTENS  # e.g. its model volume is gone now
    c = conv(host)
    with pytest.raises(InfraError) as err:
        converge.rollback(host, PATHS, c, lease_ttl_s=900)
    assert str(err.value) == (
        f"{host.address}: {INCUMBENT} did not serve again after the restore (not ready after 60s (stuck at: port; "
        f"port {PORT} not listening on the host)); check `journalctl -u {MAIN}` on the host")
    # rollback put the release it replaced back, verified serving, and cleared pending
    after = state(host)
    assert after.current is not None and after.current.image == CANDIDATE and after.pending is None
    assert host.serving(PORT) == CANDIDATE and PATHS.lease_dir not in host.dirs


def test_status_reads_state_unit_container_and_lock() -> None:
    host = with_incumbent()
    host.dirs[PATHS.lease_dir] = host.now
    host.files[f"{PATHS.lease_dir}/owner.json"] = '{"host": "elsewhere", "pid": 7, "started": 1, "what": "deploy x"}'
    s = converge.status(host, PATHS)
    assert (s.active, s.running_image, s.state) == (True, INCUMBENT, state(host))
    assert "LOCKED: deploy x by pid 7 on elsewhere" in s.render(host.address)
    assert isinstance(s.state, HostState)
