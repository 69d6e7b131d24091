"""Every way a candidate fails, under both strategies, on the scripted FakeHost.

Each is rolled back: the incumbent's unit reinstalled (swap) or never touched
(side-by-side) and serving, the state file saying why, nothing pending, the lock
free, the exit code the one host/deploy.py documents, and (swap) the outage exact.
"""

from __future__ import annotations

import pytest
from helpers_deploy import (
    CAND_UNIT,
    CANDIDATE,
    INCUMBENT,
    MAIN,
    PATHS,
    PORT,
    STAGING,
    SVC,
    FakeGate,
    run,
    settled,
    sim_stack,
    state,
    steps,
    unit_text,
    with_incumbent,
)

from stackbuild.flows.deploy_host import Interrupted
from stackbuild.host.crash import classify
from stackbuild.host.unit_probe import UnitProbe
from stackbuild.testing.fake_host import FAILS_FIRST_GENERATION, NEVER_LISTENS, SERVES, UNHEALTHY, Behaviour, crashes

NO_KERNEL = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
IMA = "CUDA error: an illegal memory access was encountered"
BODY = f'{{"object": "error", "message": "{IMA}", "type": "InternalServerError", "code": 500}}'


def hint(line: str) -> str:
    sig = classify(line)
    assert sig is not None
    return f"[{sig.kind}: {sig.hint}]"


# name -> candidate behaviour, gate verdict, exit code, verdict, cause (port: the candidate's), swap outages
CASES: dict[str, tuple[Behaviour, str, int, str, str, list[tuple[float, float]]]] = {
    "crash": (crashes(NO_KERNEL), "pass", 1, "not-ready",
              "candidate crashed on start: unit activating/auto-restart, result exit-code, exit status 1, "
              f"restarts 0 {hint(NO_KERNEL)}", [(0.0, 2.0)]),
    # the port's deadline is 60 s (start_timeout_s), polled every 0.5 s
    "never-ready": (NEVER_LISTENS, "pass", 1, "not-ready", "candidate never became ready: not ready after 60s "
                    "(stuck at: port; port {port} not listening on the host)", [(0.0, 62.5)]),
    # /health gets 60 s (ready_timeout_s) from the port opening at 2 s
    "unhealthy": (UNHEALTHY, "pass", 1, "not-ready", "candidate never became ready: not ready after 62s "
                  "(stuck at: health; /health answered 503)", [(0.0, 64.5)]),
    "first-generation": (FAILS_FIRST_GENERATION, "pass", 1, "not-ready",
                         "candidate was ready but failed its first generation: POST http://127.0.0.1:{port}"
                         f"/v1/completions: HTTP 500: {BODY.encode()!r} {hint(IMA)}", [(0.0, 4.0)]),
    # swap: down while the candidate loads, up while gated, down again while the incumbent is back
    "gate-fail": (SERVES, "fail", 1, "fail", "gate fail: C=8: fail against sim", [(0.0, 2.0), (2.0, 4.0)]),
    "gate-inconclusive": (SERVES, "inconclusive", 3, "inconclusive", "gate inconclusive: C=8: inconclusive against sim",
                          [(0.0, 2.0), (2.0, 4.0)]),
}
SIGNATURES = {"crash": ("no-kernel-image", NO_KERNEL), "first-generation": ("illegal-memory-access", IMA)}


def assert_incumbent_back(host: object, before: dict[str, object], strategy: str, started: float) -> None:
    from stackbuild.testing.fake_host import FakeHost

    assert isinstance(host, FakeHost)
    assert host.files[PATHS.unit_path(MAIN)] == unit_text(INCUMBENT)
    assert not {*PATHS.candidate_paths, PATHS.override_path} & host.files.keys() and CAND_UNIT not in host.loaded
    assert host.enabled == {MAIN: PATHS.main_path} and host.fragments[MAIN] == PATHS.main_path  # boots it
    assert set(host.running) == {MAIN} and host.state_of(MAIN) == "active"
    assert host.serving(PORT) == INCUMBENT
    if strategy == "side-by-side":  # never stopped, never restarted
        assert host.running[MAIN].started_at == started
    assert PATHS.lease_dir not in host.dirs
    after = settled(state(host))
    assert (after["current"], after["previous"], after["pending"]) == (before["current"], before["previous"], None)


@pytest.mark.parametrize("strategy", ["swap", "side-by-side"])
@pytest.mark.parametrize("case", list(CASES))
def test_failed_candidate_rolled_back(strategy: str, case: str) -> None:
    behaviour, verdict_given, code, verdict, cause, outages = CASES[case]
    host = with_incumbent(candidate=behaviour)
    before, started, t0 = settled(state(host)), host.running[MAIN].started_at, host.now
    rep = run(host, strategy, gate=FakeGate(host, {CANDIDATE: verdict_given}))

    want = cause.replace("{port}", str(STAGING if strategy == "side-by-side" else PORT))
    if strategy == "side-by-side":  # gated against the serving incumbent (incumbent: live), a swap its result
        want = want.replace("against sim", "against incumbent sim")
    assert (rep.outcome, rep.exit_code, rep.verdict, rep.cause) == ("rolled-back", code, verdict, want)
    gated = case.startswith("gate")
    assert steps(rep)[8:] == [("start", True), ("ready", gated), *([("gate", True)] if gated else []),
                              ("restore", True), ("verify serving", True)]
    assert (rep.crash_signature, rep.crash_line) == SIGNATURES.get(case, (None, None))
    if strategy == "swap":
        assert [(a - t0, b - t0) for a, b in rep.outages] == outages
        assert rep.downtime_s == sum(b - a for a, b in outages)
    else:
        assert rep.outages == [] and rep.downtime_s is None
    assert_incumbent_back(host, before, strategy, started)
    after = settled(state(host))
    assert (after["last_verdict"], after["last_cause"], after["last_image"]) == (verdict, want, CANDIDATE)


def test_crash_logs_are_the_candidates_since_its_start_without_prestart_noise() -> None:
    host = with_incumbent(candidate=crashes(NO_KERNEL))
    rep = run(host, "side-by-side")
    # the journal really has docker rm's complaint (ExecStartPre); the report drops it
    assert (host.journal[CAND_UNIT][0][1]) == f"Error: No such container: {SVC}-candidate"
    assert rep.logs == (
        f"== journalctl -u {CAND_UNIT}\n"
        "Started stackbuild sim server (stackbuild-sim-candidate).\n"
        "server: loading weights\n"
        f"{NO_KERNEL}\n"
        f"{CAND_UNIT}: Main process exited, code=exited, status=1/FAILURE\n"
        f"{CAND_UNIT}: Failed with result 'exit-code'.\n"
    )


def test_a_crash_between_polls_is_seen_at_the_next_poll_not_the_deadline() -> None:
    host = with_incumbent(candidate=crashes(NO_KERNEL, after_s=1.2))
    t0 = host.now
    rep = run(host)
    assert rep.exit_code == 1 and rep.crash_signature == "no-kernel-image"
    assert rep.outages == [(t0, t0 + 1.5 + 2.0)]  # seen at the 1.5 s poll; the incumbent back 2 s later


@pytest.mark.parametrize("strategy", ["swap", "side-by-side"])
def test_an_interruption_mid_gate_restores_the_incumbent_and_exits_4(strategy: str) -> None:
    host = with_incumbent()
    before, started = settled(state(host)), host.running[MAIN].started_at
    err = Interrupted("interrupted by SIGTERM; the incumbent is put back before exit")
    rep = run(host, strategy, gate=FakeGate(host, raises=err))
    assert (rep.outcome, rep.exit_code, rep.verdict) == ("rolled-back", 4, "error")
    assert rep.cause == "deploy step failed: interrupted by SIGTERM; the incumbent is put back before exit"
    assert steps(rep)[8:] == [("start", True), ("ready", True), ("gate", False), ("restore", True),
                              ("verify serving", True)]
    assert_incumbent_back(host, before, strategy, started)
    assert settled(state(host))["last_verdict"] == "error"


def test_a_bug_mid_deploy_still_restores_first_then_surfaces() -> None:
    host = with_incumbent()
    before = settled(state(host))
    with pytest.raises(ZeroDivisionError):
        run(host, gate=FakeGate(host, raises=ZeroDivisionError("bug")))
    assert_incumbent_back(host, before, "swap", 0.0)


def test_switch_that_fails_on_the_host_restores_the_incumbent() -> None:
    host = with_incumbent()
    before = settled(state(host))
    host.fail_when(lambda a: a == ["systemctl", "start", f"stackbuild-switch-{SVC}.service"], rc=1,
                   stderr="Job failed")
    rep = run(host, "side-by-side")
    assert (rep.outcome, rep.exit_code) == ("rolled-back", 4)
    assert rep.cause == f"deploy step failed: switch {SVC} to the candidate failed on {host.address}"
    assert_incumbent_back(host, before, "swap", 0.0)


# --- nothing measured unless it is the candidate (issue #29) --------------------------------


def test_a_candidate_that_dies_on_a_port_the_incumbent_holds_is_a_start_failure_not_a_promotion() -> None:
    """The reproduced case: staging_port == port (a stack from before `validate` refused it). The
    candidate loads, then dies with EADDRINUSE; every layer meanwhile reaches the incumbent."""
    host = with_incumbent(candidate=Behaviour(listens_after_s=2.0))
    stack = sim_stack()
    clash = stack.model_copy(update={"runtime": stack.runtime.model_copy(update={"staging_port": PORT})})
    gate = FakeGate(host)
    rep = run(host, "side-by-side", gate=gate, stack=clash)
    assert (rep.outcome, rep.exit_code, rep.verdict) == ("rolled-back", 1, "not-ready")
    assert rep.cause is not None and rep.cause.startswith(
        f"candidate is not what answers on its port: the server on port {PORT} is not {CAND_UNIT}'s process: "
        "it says weight_version 'sb-")
    assert gate.calls == []  # nothing measured
    st = settled(state(host))
    assert st["current"]["image"] == INCUMBENT and st["pending"] is None and st["last_verdict"] == "not-ready"
    assert host.serving(PORT) == INCUMBENT and host.state_of(MAIN) == "active"
    assert CAND_UNIT not in host.running and host.unit_file(CAND_UNIT) is None


def test_the_identity_is_this_start_of_the_unit() -> None:
    host = with_incumbent()
    inv = host.units[MAIN].invocation
    assert inv and host.running[MAIN].weight_version == f"sb-{inv}"
    probe = UnitProbe(host, MAIN, PORT, host.http_probe(f"http://127.0.0.1:{PORT}"))
    assert probe.confirm() is None
    # the same unit started again is another process: the old answer no longer proves it
    host.run(["systemctl", "stop", MAIN])
    host.run(["systemctl", "start", MAIN])
    assert host.units[MAIN].invocation != inv
    host.sleep(2.0)
    assert probe.confirm() is None and host.running[MAIN].weight_version == f"sb-{host.units[MAIN].invocation}"
    # a unit that is gone is a crash, whatever answers on its port
    gone = UnitProbe(host, CAND_UNIT, PORT, host.http_probe(f"http://127.0.0.1:{PORT}"))
    assert gone.confirm() == ("identity", f"the server on port {PORT} is not {CAND_UNIT}'s process: it says "
                              f"weight_version 'sb-{host.units[MAIN].invocation}', this start of the unit is None")


def test_a_candidate_replaced_during_its_gate_is_no_result() -> None:
    """What the gate measured is the candidate's only if the candidate's own process answered
    before and after it: one restarted meanwhile (another InvocationID) is rolled back, exit 4."""
    host = with_incumbent()

    class Restarts(FakeGate):
        def __call__(self, url, prof, name, baseline):  # type: ignore[no-untyped-def]
            out = super().__call__(url, prof, name, baseline)
            host.run(["systemctl", "stop", CAND_UNIT])
            host.run(["systemctl", "start", CAND_UNIT])
            host.sleep(2.0)
            return out

    rep = run(host, "side-by-side", gate=Restarts(host))
    assert (rep.outcome, rep.exit_code, rep.verdict) == ("rolled-back", 4, "error")
    assert rep.cause is not None and rep.cause.startswith(
        f"the gate did not measure the candidate: {CAND_UNIT} was started again")
    assert settled(state(host))["current"]["image"] == INCUMBENT and host.serving(PORT) == INCUMBENT
