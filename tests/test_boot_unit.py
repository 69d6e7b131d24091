"""Boot safety on the scripted FakeHost (issue 23): the promoted release's unit is enabled, a
candidate never is, and a host whose deploy or rollback dies at any step boots the release its
state file names; the next run converges it and finishes.

A kill is the client's SIGKILL (fake_base.Client: no `finally` of the flow runs, the lock stays);
a reboot is a power cycle of the host (fake_systemd.reboot: /run emptied, servers killed, enabled
units started).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from helpers_deploy import (
    CAND_UNIT,
    CANDIDATE,
    INCUMBENT,
    MAIN,
    PATHS,
    PORT,
    FakeGate,
    assert_boots_what_the_state_names,
    reboot_serves,
    run,
    state,
    unit_text,
    with_incumbent,
)
from test_converge_unit import conv

from stackbuild.gate.result import GateResult
from stackbuild.host import converge, units
from stackbuild.host.ssh import sh_argv
from stackbuild.testing.fake_host import Client, FakeHost, Killed

Argv = list[str]
PENDING = ["<put>", PATHS.state_file, "0644"]


def _is(want: Argv) -> Callable[[str, Argv], bool]:
    return lambda _addr, args: args == want


def _commit(args: Argv) -> bool:
    return args[:3] == ["sh", "-c", units.COMMIT_SCRIPT]


# step -> (kill before this command, kill after it); the gate's kill is its own (below)
STEPS: dict[str, tuple[Callable[[str, Argv], bool] | None, Callable[[str, Argv], bool] | None]] = {
    "staged": (_is(PENDING), None),  # the unit staged and verified, the host not yet marked
    "candidate started": (None, lambda _a, args: args[:2] == ["systemctl", "start"]),
    "gating": (None, None),
    "switch written": (_is(["systemctl", "start", PATHS.switch_unit]), None),  # its unit in /run, not run
    "switching": (None, _is(["systemctl", "start", PATHS.switch_unit])),  # the host ran it, the client died
    "committed": (None, lambda _a, args: _commit(args)),  # committed, the report never written
}


def _killing_gate(host: FakeHost) -> Callable[..., GateResult]:
    def gate(*_a: object) -> GateResult:
        raise host.client.kill("killed mid-gate")

    return gate


def _killed_deploy(strategy: str, step: str) -> FakeHost:
    host = with_incumbent()
    before, after = STEPS[step]
    host.client = Client(die_before=before, die_after=after)
    with pytest.raises(Killed):
        run(host, strategy, gate=_killing_gate(host) if step == "gating" else FakeGate(host))
    assert host.client.dead and PATHS.lease_dir in host.dirs  # nothing cleaned up after a SIGKILL
    host.client = Client()  # the next stackbuild process
    return host


def _steps(strategy: str) -> list[str]:
    return [s for s in STEPS if strategy == "side-by-side" or not s.startswith("switch")]


@pytest.mark.parametrize("strategy", ["swap", "side-by-side"])
def test_a_host_killed_at_any_step_of_a_deploy_boots_what_its_state_names_then_the_rerun_finishes(
        strategy: str) -> None:
    for step in _steps(strategy):
        host = _killed_deploy(strategy, step)
        st = state(host)
        committed, marked = step == "committed", step not in ("staged", "committed")
        assert (st.pending is not None, st.current is not None and st.current.image) == (
            marked, CANDIDATE if committed else INCUMBENT), step
        assert host.enabled == {MAIN: PATHS.main_path}, step  # the committed unit, never a candidate
        assert_boots_what_the_state_names(host)
        rep = run(host, strategy)
        assert (rep.outcome, rep.exit_code) == ("promoted", 0), (step, rep.render())
        assert ("recover" in [s.name for s in rep.steps]) == marked, step
        assert state(host).current is not None and state(host).current.image == CANDIDATE  # type: ignore[union-attr]
        assert_boots_what_the_state_names(host)


@pytest.mark.parametrize("strategy", ["swap", "side-by-side"])
def test_a_deploy_killed_at_any_step_then_rerun_without_a_reboot_finishes(strategy: str) -> None:
    for step in _steps(strategy):
        host = _killed_deploy(strategy, step)
        rep = run(host, strategy)
        assert (rep.outcome, rep.exit_code) == ("promoted", 0), (step, rep.render())
        assert "broke a stale lock" in rep.steps[0].detail
        # what the killed run left is gone: candidate and switch units, the override, the lock
        left = {*PATHS.candidate_paths, *PATHS.switch_paths, PATHS.override_path, PATHS.lease_dir} & (
            host.files.keys() | host.dirs.keys())
        assert (left, set(host.running), host.serving(PORT)) == (set(), {MAIN}, CANDIDATE), step
        assert host.enabled == {MAIN: PATHS.main_path} and host.files[PATHS.main_path] == unit_text(CANDIDATE)


def test_the_candidate_unit_is_never_enabled_and_runs_from_run() -> None:
    host = with_incumbent()
    seen: list[tuple[str, str, str]] = []

    def gate(url: str, *a: object) -> GateResult:
        seen.append((host.unit_file_state(CAND_UNIT), host.fragments[CAND_UNIT], host.unit_file_state(MAIN)))
        return FakeGate(host)(url, *a)  # type: ignore[arg-type]

    assert run(host, "side-by-side", gate=gate).exit_code == 0  # type: ignore[arg-type]
    assert seen == [("disabled", PATHS.candidate_paths[0], "enabled")]
    # systemctl would answer the same
    assert host.run(["systemctl", "is-enabled", MAIN], check=False).stdout == "enabled\n"
    res = host.run(["systemctl", "is-enabled", CAND_UNIT], check=False)
    assert (res.returncode, res.stderr) == (1, f"Failed to get unit file state for {CAND_UNIT}: No such file or "
                                               "directory")


ROLLBACK_STEPS: dict[str, Callable[[str, Argv], bool]] = {
    "marked": lambda _a, args: args == PENDING,
    "previous started": lambda _a, args: args == ["systemctl", "start", MAIN],
    "committed": lambda _a, args: _commit(args),
}


@pytest.mark.parametrize("step", list(ROLLBACK_STEPS))
def test_a_rollback_killed_at_any_step_boots_what_the_state_names_and_reruns(step: str) -> None:
    host = with_incumbent()
    assert run(host).exit_code == 0  # CANDIDATE current, INCUMBENT previous
    host.client = Client(die_after=ROLLBACK_STEPS[step])
    with pytest.raises(Killed):
        converge.rollback(host, PATHS, conv(host), lease_ttl_s=900)
    host.client = Client()
    want = INCUMBENT if step == "committed" else CANDIDATE
    assert state(host).current is not None and state(host).current.image == want  # type: ignore[union-attr]
    assert_boots_what_the_state_names(host)
    if step != "committed":
        done = converge.rollback(host, PATHS, conv(host), lease_ttl_s=900)
        assert done.current is not None and done.current.image == INCUMBENT
        assert_boots_what_the_state_names(host)


def test_converge_enables_a_main_unit_an_earlier_version_left_disabled_and_removes_its_leftovers() -> None:
    host = with_incumbent()
    host.enabled.clear()  # deployed before units were enabled: nothing would start on boot
    for path in (PATHS.unit_path(CAND_UNIT), PATHS.unit_path(PATHS.switch_unit)):
        host.files[path] = "[Service]\nExecStart=/bin/true\n"
    host._daemon_reload()
    started = host.running[MAIN].started_at
    c = conv(host)
    converge.to_current(host, PATHS, state(host), c)
    assert ["systemctl", "enable", "--quiet", MAIN] in host.commands
    assert c.report.steps[0].detail == (f"{MAIN} already runs {INCUMBENT}; "
                                        "enabled it (it was disabled: no start on boot)")
    assert host.running[MAIN].started_at == started and c.report.outages == []  # not restarted
    assert not [f for f in host.files if "candidate.service" in f or "switch" in f]
    assert reboot_serves(host) == INCUMBENT


def test_status_says_whether_the_service_starts_on_boot() -> None:
    host = with_incumbent()
    s = converge.status(host, PATHS)
    assert (s.active, s.enabled, s.under_test) == (True, "enabled", False)
    assert s.render(host.address).splitlines()[0] == f"{host.address} {PATHS.service}: active, enabled (starts on boot)"
    host.run(sh_argv(units.REMOVE_SCRIPT, MAIN))  # stopped and disabled, the file kept
    s = converge.status(host, PATHS)
    assert s.render(host.address).splitlines()[0] == (
        f"{host.address} {PATHS.service}: NOT active, disabled: does NOT start on boot")
    assert reboot_serves(host) is None
