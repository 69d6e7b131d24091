"""The deploy flow's good paths on the scripted FakeHost: first deploy, swap, side-by-side.

Exact steps, outcome, state file, units, secrets files and (for the first deploy) the
whole command sequence; the fake clock makes the reported downtime exact.
"""

from __future__ import annotations

from helpers_deploy import (
    BACKUP,
    CAND_ENV,
    CAND_UNIT,
    CANDIDATE,
    D_CAND,
    D_INC,
    ENV,
    INCUMBENT,
    MAIN,
    OPERATOR_ENV,
    PATHS,
    PORT,
    STAGING,
    SVC,
    FakeGate,
    assert_boots_what_the_state_names,
    fake_host,
    owners_masked,
    profile,
    run,
    settled,
    sim_stack,
    state,
    steps,
    unit_text,
    with_incumbent,
)

from stackbuild.gate.result import GateResult
from stackbuild.host import secrets, units
from stackbuild.host.preflight import DOCKER_INFO, TCP_SCRIPT
from stackbuild.host.ssh import READ_FILE_SCRIPT, READ_IF_EXISTS_SCRIPT, sh_argv
from stackbuild.host.state import ACQUIRE_SCRIPT, RELEASE_SCRIPT, release_key
from stackbuild.host.unit_probe import POLL_SCRIPT
from stackbuild.spec.stack import Stack

GOOD = [("lock", True), ("state", True), ("preflight", True), ("pull", True), ("stage unit", True),
        ("baseline", True), ("mark pending", True), ("secrets", True), ("start", True), ("ready", True),
        ("gate", True)]


def release(image: str, digest: str, verdict: str = "pass") -> dict[str, object]:
    return {"image": image, "digest": digest, "stack": "sim", "variant": None, "unit": unit_text(image),
            "port": PORT, "verdict": verdict, "at": "T", "slot": "main"}


def test_first_deploy_promotes_commits_and_sends_exactly_these_commands() -> None:
    host = fake_host()
    gate = FakeGate(host)
    rep = run(host, gate=gate, secrets={"HF_TOKEN": "tok"})
    sent = owners_masked(host.commands)

    assert (rep.outcome, rep.exit_code, rep.verdict, rep.cause) == ("promoted", 0, "pass", None)
    assert steps(rep) == [*GOOD, ("promote", True)]
    assert rep.downtime_s is None and rep.outages == []  # nothing served before
    assert settled(state(host)) == {"service": SVC, "current": release(CANDIDATE, D_CAND), "previous": None,
                                    "last_verdict": "pass", "last_cause": None, "last_image": CANDIDATE,
                                    "last_at": "T", "pending": None}
    key = release_key(D_CAND, unit_text(CANDIDATE))
    stored = GateResult.model_validate_json(host.files[PATHS.result_file(key)])
    assert (stored.name, stored.verdict, stored.fingerprint) == ("sim", "reference", profile().workload().fingerprint())
    # the secret landed in the operator's file only, committed (no backup left); the server got it
    assert host.files[ENV] == '# written by stackbuild; mode 0600; secrets by name\nHF_TOKEN="tok"\n'
    assert host.modes[ENV] == 0o600
    assert not {BACKUP, BACKUP + ".absent", CAND_ENV} & host.files.keys()
    assert host.running[MAIN].image == CANDIDATE and host.running[MAIN].env == {"HF_TOKEN": "tok"}
    assert [(c.served_by, c.baseline, c.url) for c in gate.calls] == [(CANDIDATE, None, f"http://127.0.0.1:{PORT}")]
    assert PATHS.lease_dir not in host.dirs
    # committed: the unit in /etc, enabled (linked to that file), the override gone
    main = PATHS.main_path
    assert (host.files[main], host.fragments[MAIN], host.enabled) == (unit_text(CANDIDATE), main, {MAIN: main})
    assert host.unit_file_state(MAIN) == "enabled" and PATHS.override_path not in host.files

    staged, unit_path = f"{PATHS.staging_dir}/{MAIN}", PATHS.unit_path(MAIN)
    staged_state = f"{PATHS.staging_dir}/state.json"
    inspect = ["docker", "image", "inspect", "--format", "{{.Id}}", CANDIDATE]
    poll = sh_argv(POLL_SCRIPT, MAIN)
    assert sent == [
        sh_argv(ACQUIRE_SCRIPT, PATHS.lease_dir, "<owner>"),
        sh_argv(READ_IF_EXISTS_SCRIPT, PATHS.state_file),
        # preflight: reads only
        DOCKER_INFO, inspect, ["df", "-Pk", "/var/lib/docker"], sh_argv(TCP_SCRIPT),
        inspect, ["docker", "pull", "--quiet", CANDIDATE],
        ["mkdir", "-p", PATHS.staging_dir], ["<put>", staged, "0644"], ["systemd-analyze", "verify", staged],
        ["mkdir", "-p", PATHS.base], ["<put>", PATHS.state_file, "0644"],  # pending marked
        sh_argv(READ_FILE_SCRIPT, ENV), ["mkdir", "-p", "-m", "0700", "/etc/stackbuild"],
        sh_argv(secrets.BACKUP_SCRIPT, ENV, BACKUP), ["<put>", ENV, "0600"],
        # the candidate runs from the main unit's /run override: not enabled, gone on a reboot
        ["date", "+%s"], sh_argv(units.INSTALL_SCRIPT, staged, PATHS.override_path),
        ["systemctl", "reset-failed", MAIN], ["systemctl", "start", MAIN],
        poll, poll, poll, poll, poll,  # it listens 2 s after its start; polled every 0.5 s
        poll,  # then: is that its own process (still running, its identity), as also around the gate
        poll, poll,
        ["mkdir", "-p", f"{PATHS.base}/results"], ["<put>", PATHS.result_file(key), "0644"],
        # the commit: unit into /etc, override dropped, enabled, then the state, in one command
        # and the transaction's secrets files (the backup: the operator's file now holds what runs)
        ["<put>", staged_state, "0644"],
        sh_argv(units.COMMIT_SCRIPT, staged, unit_path, PATHS.override_path, MAIN, staged_state, PATHS.state_file,
                CAND_UNIT, PATHS.unit_path(CAND_UNIT), BACKUP, f"{BACKUP}.absent", CAND_ENV),
        sh_argv(RELEASE_SCRIPT, PATHS.lease_dir, "<owner>"),
    ]


def test_swap_stops_the_incumbent_and_reports_the_exact_outage() -> None:
    host = with_incumbent()
    before = state(host)
    gate = FakeGate(host)
    t0 = host.now
    rep = run(host, gate=gate)

    assert (rep.outcome, rep.exit_code, rep.verdict) == ("promoted", 0, "pass")
    assert steps(rep) == [*GOOD, ("promote", True)]
    assert rep.steps[-1].detail == f"host state committed; {MAIN} enabled (starts on boot)"
    assert rep.steps[5].detail == f"stored result of {D_INC[:19]} (fingerprint {profile().workload().fingerprint()})"
    # stopped at t0, the candidate listens 2 s after its start: one outage of exactly 2 s
    assert rep.outages == [(t0, t0 + 2.0)] and rep.downtime_s == 2.0
    assert "downtime: 2.00s in 1 outage(s)" in rep.render()
    st = settled(state(host))
    assert st["current"] == release(CANDIDATE, D_CAND)
    assert st["previous"] == {**release(INCUMBENT, D_INC), "at": "T"} and before.current is not None
    assert st["pending"] is None
    assert [(c.served_by, c.baseline) for c in gate.calls] == [(CANDIDATE, "sim")]  # baseline: the stored result
    start = host.commands.index(["date", "+%s"])
    assert host.commands[start:start + 5] == [
        ["date", "+%s"], ["systemctl", "stop", MAIN],
        sh_argv(units.INSTALL_SCRIPT, f"{PATHS.staging_dir}/{MAIN}", PATHS.override_path),
        ["systemctl", "reset-failed", MAIN], ["systemctl", "start", MAIN],
    ]
    assert host.files[PATHS.unit_path(MAIN)] == unit_text(CANDIDATE)
    assert host.running[MAIN].image == CANDIDATE and set(host.running) == {MAIN}
    assert_boots_what_the_state_names(host)


def test_side_by_side_gates_on_the_staging_port_then_switches_in_one_transaction() -> None:
    host = with_incumbent(env=OPERATOR_ENV)
    incumbent_started = host.running[MAIN].started_at
    gate = FakeGate(host)
    t0 = host.now
    rep = run(host, "side-by-side", gate=gate, secrets={"HF_TOKEN": "new"})

    assert (rep.outcome, rep.exit_code, rep.verdict) == ("promoted", 0, "pass")
    assert steps(rep) == [*GOOD, ("switch", True), ("ready", True), ("promote", True)]
    merged = OPERATOR_ENV.replace("HF_TOKEN=operator-value", 'HF_TOKEN="new"')
    # while gated: the candidate on the staging port with its own env file; the incumbent untouched
    (call,) = gate.calls  # against the serving incumbent, ABBA (incumbent: live, the default)
    assert (call.url, call.served_by, call.baseline, call.live) == (
        f"http://127.0.0.1:{STAGING}", CANDIDATE, "incumbent sim", f"http://127.0.0.1:{PORT} {INCUMBENT}")
    assert call.units == {MAIN: "active", CAND_UNIT: "active"}
    assert call.running == {MAIN: (INCUMBENT, PORT, incumbent_started, {"HF_TOKEN": "operator-value"}),
                            CAND_UNIT: (CANDIDATE, STAGING, t0 + 0.0, {"HF_TOKEN": "new"})}
    assert rep.steps[7].detail == f"{CAND_ENV}: set HF_TOKEN"
    # candidate ready 2 s after its start; the switch at t0+2 and the new main unit listens 2 s later
    assert rep.outages == [(t0 + 2.0, t0 + 4.0)] and rep.downtime_s == 2.0
    switch = host.commands.index(["systemctl", "daemon-reload"])
    one_shot = f"stackbuild-switch-{SVC}.service"
    assert host.commands[switch - 2:switch + 4] == [
        ["<put>", f"{PATHS.staging_dir}/switch.sh", "0700"],
        ["<put>", f"/run/systemd/system/{one_shot}", "0644"],
        ["systemctl", "daemon-reload"],
        ["systemctl", "reset-failed", one_shot],
        ["systemctl", "start", one_shot],
        # the transaction ran to its end: its unit goes (and one an earlier version left in /etc)
        sh_argv(units.REMOVE_SCRIPT, one_shot, f"/run/systemd/system/{one_shot}", f"/etc/systemd/system/{one_shot}"),
    ]
    assert [c for c in host.commands[:switch] if MAIN in c] == [["systemctl", "is-active", MAIN]]  # only looked at
    assert one_shot not in host.loaded and not [f for f in host.files if one_shot in f]
    # the candidate ran from /run, never enabled; the switch started the main unit from its override
    assert call.units == {MAIN: "active", CAND_UNIT: "active"} and host.enabled == {MAIN: PATHS.main_path}
    # after: the main unit (operator's env file) runs the candidate; the candidate unit and its copy are gone
    assert set(host.running) == {MAIN} and host.running[MAIN].image == CANDIDATE
    assert host.running[MAIN].env == {"HF_TOKEN": "new"}
    assert host.files[PATHS.unit_path(MAIN)] == unit_text(CANDIDATE)
    assert not {*PATHS.candidate_paths, PATHS.override_path} & host.files.keys() and CAND_UNIT not in host.loaded
    assert host.files[ENV] == merged and host.modes[ENV] == 0o600
    assert not {BACKUP, CAND_ENV} & host.files.keys()
    st = settled(state(host))
    assert (st["current"], st["previous"]["image"], st["pending"]) == (release(CANDIDATE, D_CAND), INCUMBENT, None)
    assert_boots_what_the_state_names(host)


def test_candidate_unit_text_is_the_staging_render() -> None:
    host = with_incumbent()
    gate = FakeGate(host)

    def check(url: str, *a: object) -> GateResult:
        assert host.files[PATHS.candidate_paths[0]] == unit_text(CANDIDATE, STAGING, f"{SVC}-candidate", CAND_ENV)
        assert host.unit_file_state(CAND_UNIT) == "disabled" and host.unit_file_state(MAIN) == "enabled"
        return gate(url, *a)  # type: ignore[arg-type]

    rep = run(host, "side-by-side", gate=check)  # type: ignore[arg-type]
    assert rep.exit_code == 0 and len(gate.calls) == 1


def test_without_a_stored_result_the_incumbent_is_measured_first_and_kept() -> None:
    host = with_incumbent()
    cur = state(host).current
    assert cur is not None
    del host.files[PATHS.result_file(cur.key)]
    gate = FakeGate(host)
    rep = run(host, gate=gate)
    assert rep.exit_code == 0
    assert rep.steps[5].detail == f"measured the incumbent now (fingerprint {profile().workload().fingerprint()})"
    # measured while it still served, before anything was stopped; then the candidate against it
    assert [(c.served_by, c.name, c.baseline) for c in gate.calls] == [
        (INCUMBENT, "incumbent sim", None), (CANDIDATE, "sim", "incumbent sim")]
    assert GateResult.model_validate_json(host.files[PATHS.result_file(cur.key)]).name == "incumbent sim"


def test_a_result_measured_through_another_path_is_not_a_baseline() -> None:
    host = with_incumbent()
    gate = FakeGate(host)
    rep = run(host, gate=gate, access="tunnel")  # the stored one was measured direct
    assert rep.steps[5].detail.startswith("measured the incumbent now")
    assert [c.served_by for c in gate.calls] == [INCUMBENT, CANDIDATE]



def stored_stack() -> Stack:
    stack = sim_stack()
    quick = stack.gate.profiles["quick"].model_copy(update={"incumbent": "stored"})
    return stack.model_copy(update={"gate": stack.gate.model_copy(update={"profiles": {"quick": quick}})})


def test_side_by_side_measures_the_serving_incumbent_live_and_says_so() -> None:
    """`incumbent: live` (the default): the gate gets the serving incumbent's URL; no stored result is read."""
    host = with_incumbent()
    gate = FakeGate(host)
    rep = run(host, "side-by-side", gate=gate)
    assert (rep.outcome, rep.exit_code) == ("promoted", 0), rep.render()
    (call,) = gate.calls
    assert (call.url, call.served_by, call.baseline, call.live) == (
        f"http://127.0.0.1:{STAGING}", CANDIDATE, "incumbent sim", f"http://127.0.0.1:{PORT} {INCUMBENT}")
    assert rep.steps[5].detail == (f"live: the incumbent on port {PORT}, measured in alternation with the "
                                   "candidate (ABBA, the profile's incumbent: live)")
    assert not [c for c in host.commands if c[:1] == ["cat"] and "/results/" in c[-1]]
    cur = state(host).current
    assert cur is not None and cur.image == CANDIDATE
    assert GateResult.model_validate_json(host.files[PATHS.result_file(cur.key)]).name == "sim"


def test_side_by_side_with_incumbent_stored_is_gated_against_the_stored_result() -> None:
    host = with_incumbent()
    gate = FakeGate(host)
    rep = run(host, "side-by-side", gate=gate, stack=stored_stack())
    assert rep.exit_code == 0
    assert [(c.served_by, c.baseline, c.live) for c in gate.calls] == [(CANDIDATE, "sim", None)]
    assert rep.steps[5].detail == f"stored result of {D_INC[:19]} (fingerprint {profile().workload().fingerprint()})"
