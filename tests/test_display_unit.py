"""results.display and results.steplog: what a person sees while a deploy or a rollout runs, and
the step log it leaves, on fake event sequences; then a deploy and a rollout on the scripted
FakeHosts, whose logs must hold every step."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers_deploy import CANDIDATE, FakeGate, sim_stack, with_incumbent
from helpers_fleet import FakeReach, fake_fleet, fleet_stack, rollout
from rich.console import Console

from stackbuild.errors import InfraError, InputError
from stackbuild.flows.deploy_host import DeployArgs, run_deploy
from stackbuild.host.outcome import DeployReport
from stackbuild.host.ssh import SshOptions
from stackbuild.results.display import Display, Log, Note, Result, Step, bind, clock_text, stage_times
from stackbuild.results.steplog import StepLog, log_path

NOW = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def swap_then_rollback(d: Display, clock: Clock) -> None:
    """h0 promoted side-by-side, h1 rolled back by its gate, with the rollout's own lines."""
    d.hosts(["h0", "h1"])
    d(Note("fleet: canary: h0"))
    for name, took in [("lock", 0.1), ("state", 0.1), ("preflight", 0.5), ("start", 0.5), ("ready", 3.7),
                       ("gate", 7.9), ("switch", 4.0), ("ready", 2.9), ("promote", 0.7)]:
        d(Step("h0", name))
        clock.t += took
        d(Step("h0", name, True, took, f"{name} went fine"))
    d(Result("h0", "promoted", "pass"))
    d(Step("h0", "soak", phase=True))
    clock.t += 2
    d(Step("h0", "soak", True, 2.0, phase=True))
    d(Note("soak: held: 3 samples healthy over 2s", "h0"))
    for name, ok in [("lock", True), ("start", True), ("gate", True), ("restore", True)]:
        d(Step("h1", name))
        clock.t += 1
        d(Step("h1", name, ok, 1.0))
    d(Result("h1", "rolled-back", "fail"))


def test_plain_output_is_the_notes_and_a_line_per_host_per_stage_change() -> None:
    out: list[str] = []
    progress: list[str] = []
    clock = Clock()
    with Display(echo=out.append, progress=progress.append, clock=clock) as d:
        swap_then_rollback(d, clock)
    assert out == ["fleet: canary: h0", "[h0] soak: held: 3 samples healthy over 2s"]
    # "ready" stays in the stage it follows; the switch is the side-by-side promotion; a phase
    # (soak) is announced by the rollout, not here
    assert progress == ["[h0] prepare", "[h0] start", "[h0] gate", "[h0] promote",
                        "[h1] prepare", "[h1] start", "[h1] gate", "[h1] rollback"]


def test_live_view_is_one_line_per_host_stage_step_elapsed_verdict() -> None:
    clock = Clock()
    d = Display(echo=lambda _: None, progress=lambda _: None, clock=clock, title="rollout r1 of sim")
    d.hosts(["h0", "h1", "h2"])
    d(Step("h0", "lock"))
    clock.t += 1
    d(Step("h0", "lock", True, 1.0))
    d(Step("h0", "gate"))
    clock.t += 75
    d(Step("h1", "pull", phase=True))
    clock.t += 4
    d(Step("h1", "pull", True, 4.0, phase=True))
    clock.t += 10
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(d.view())
    assert [ln.rstrip() for ln in console.file.getvalue().splitlines()] == [  # type: ignore[attr-defined]
        "rollout r1 of sim",
        "host  stage    step     elapsed  verdict",
        "h0    gate     gate     1m29s",
        "h1    pull     pull ok  4s",  # a phase over: its time stays
        "h2    waiting",
    ]
    d(Result("h0", "rolled-back", "fail"))
    clock.t += 30
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(d.view())
    assert console.file.getvalue().splitlines()[2].rstrip() == "h0    gate     gate     1m29s    rolled-back (fail)"  # type: ignore[attr-defined]


def test_live_mode_draws_on_the_terminal_and_erases_itself_at_the_end() -> None:
    buf = io.StringIO()
    out: list[str] = []
    progress: list[str] = []
    d = Display(echo=out.append, progress=progress.append, live=True, title="deploy sim -> h",
                console=Console(file=buf, force_terminal=True, width=80, color_system=None))
    with d:
        d(Step("h", "gate"))
        d(Note("a note"))
    drawn = buf.getvalue()
    assert "deploy sim -> h" in drawn and re.search(r"h +gate +gate", drawn)
    assert drawn.endswith("\x1b[2K")  # transient: the view is erased, the caller prints the summary
    assert out == ["a note"] and progress == []  # no plain stage lines under a live view
    d(Step("h", "promote"))  # after the view: plain again
    assert progress == ["[h] promote"]


def test_on_a_terminal_notes_print_above_the_live_view_through_rich() -> None:
    buf = io.StringIO()
    out: list[str] = []
    d = Display(echo=out.append, progress=lambda _: None, live=True, stdout_is_terminal=True,
                console=Console(file=buf, force_terminal=True, width=80, color_system=None))
    with d:
        d(Step("h", "gate"))
        d(Note("a note", "h"))
    assert out == []  # not written past rich (click.echo would land inside the view)
    drawn = buf.getvalue()
    assert "[h] a note\n" in drawn and drawn.index("[h] a note") > drawn.index("\x1b[2K")  # the view erased first
    d(Note("after"))
    assert out == ["after"]


def test_the_log_gets_every_step_as_it_starts_and_ends_and_every_note(tmp_path: Path) -> None:
    clock = Clock()
    with StepLog(tmp_path / "logs" / "x.log", now=lambda: NOW).open() as log:
        d = Display(echo=lambda _: None, progress=lambda _: None, log=log, clock=clock)
        d(Step("h0", "gate"))
        d(Step("h0", "gate", False, 12.345, "fail: C=8: slower\nsecond line"))
        d(Note("fleet: stop at canary"))
        d(Log("deploy sim -> h0\n  outcome: rolled-back (exit 1)", "h0"))
        d(Result("h0", "rolled-back", "fail"))
        d(Step("h1", "soak", phase=True))
    t = "2026-01-02T03:04:05.678Z"
    assert (tmp_path / "logs" / "x.log").read_text().splitlines() == [
        f"{t} [h0] gate ...",
        f"{t} [h0] gate FAILED 12.35s fail: C=8: slower",
        f"{t} [h0] second line",
        f"{t} fleet: stop at canary",
        f"{t} [h0] deploy sim -> h0",
        f"{t} [h0]   outcome: rolled-back (exit 1)",
        f"{t} [h0] result: rolled-back (fail)",
        f"{t} [h1] soak ...",
    ]


def test_the_log_blanks_given_secret_values_and_what_looks_like_one(tmp_path: Path) -> None:
    log = StepLog(tmp_path / "l.log", secrets=["s3cr3t-v4lue", "abc", ""], now=lambda: NOW).open()
    log.write("env: s3cr3t-v4lue, abc; HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz", "h")
    log.close()
    log.write("after close: nothing")
    assert (tmp_path / "l.log").read_text() == (
        "2026-01-02T03:04:05.678Z [h] env: [redacted], abc; HF_TOKEN=[redacted]\n")


def test_an_unwritable_log_is_refused_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "logs").write_text("a file where the folder goes")
    with pytest.raises(InputError, match=r"cannot write the step log here .*pass --ledger with a writable path"):
        StepLog(log_path(tmp_path / "ledger.db", "rollout", "r1/x y")).open()
    assert log_path(tmp_path / "ledger.db", "rollout", "r1/x y") == tmp_path / "logs" / "rollout-r1_x_y.log"


def test_stages_fold_steps_and_a_new_step_is_a_stage_of_its_own() -> None:
    assert stage_times([("lock", 1.0), ("state", 0.5), ("recover", 6.0), ("pull", 2.0), ("start", 1.0),
                        ("ready", 3.0), ("gate", 5.0), ("switch", 1.0), ("ready", 2.0), ("promote", 0.5),
                        ("drain", 4.0)]) == [
        ("prepare", 3.5), ("recover", 6.0), ("start", 4.0), ("gate", 5.0), ("promote", 3.5), ("drain", 4.0)]
    assert [clock_text(s) for s in (0.4, 59.9, 60, 3725)] == ["0s", "59s", "1m00s", "62m05s"]


def test_bind_stamps_the_host_and_a_report_tells_its_notes_too() -> None:
    seen: list[object] = []
    rep = DeployReport(host="root@10.0.0.1", service="s", stack="x", image="i", strategy="swap",
                       live=bind(seen.append, "h3"))
    rep.note("baseline", True, "first deploy: absolute bars only")
    assert seen == [Step("h3", "baseline", True, 0.0, "first deploy: absolute bars only")]


def _deploy(tmp_path: Path, gate: FakeGate | None, secret: str) -> tuple[int, list[str], DeployReport, Path]:
    host = with_incumbent()
    reach = FakeReach({"gpu1": host}, {"gpu1": gate} if gate else {})
    stack = sim_stack()
    # no registry here: no channel to promote, no gateway image to build (tests/test_gateway_deploy_unit.py has one)
    stack = stack.model_copy(update={"host": stack.host.model_copy(update={"channel": None}), "gateway": None})
    args = DeployArgs(stack=stack, ssh=SshOptions(), host_text="root@gpu1", strategy="swap", image=CANDIDATE,
                      ledger=tmp_path / "ledger.db", root=tmp_path, tunnel=False, reach=reach,
                      secrets={"HF_TOKEN": secret})
    out: list[str] = []
    reports: list[DeployReport] = []
    code = run_deploy(args, echo=out.append, reports=reports)
    (log,) = (tmp_path / "logs").iterdir()
    return code, out, reports[0], log


def test_a_deploy_prints_its_summary_and_logs_every_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, rep, log = _deploy(tmp_path, None, "s3cr3t-value-never-logged")
    assert code == 0 and log.name.startswith("deploy-") and log.name.endswith(".log")
    assert capsys.readouterr().err.splitlines() == [
        "[root@gpu1] prepare", "[root@gpu1] start", "[root@gpu1] gate", "[root@gpu1] promote"]
    assert out[0] == f"step log: {log}"
    summary = out[1].splitlines()
    assert summary[0] == "deploy sim -> fake@127.0.0.1 (stackbuild-sim, swap)"
    assert re.fullmatch(r"  took [\d.]+s: prepare [\d.]+s, start [\d.]+s, gate [\d.]+s, promote [\d.]+s", summary[2])
    assert summary[3:5] == ["  outcome: promoted (exit 0)", "  gate verdict: pass"]  # no step failed: none listed
    assert summary[-1] == f"  step log: {log}"
    lines = [ln.partition(" ")[2] for ln in log.read_text().splitlines()]
    ended = [ln for ln in lines if re.match(r"\[root@gpu1\] [a-z ]+ (ok|FAILED) [\d.]+s", ln)]
    assert ended == [f"[root@gpu1] {s.name} {'ok' if s.ok else 'FAILED'} {s.seconds:.2f}s {s.detail}".rstrip()
                     for s in rep.steps]  # every step, in order, with its whole detail
    started = [ln.removesuffix(" ...") for ln in lines if ln.endswith(" ...")]
    assert started == [f"[root@gpu1] {s.name}" for s in rep.steps]
    assert "[root@gpu1]   outcome: promoted (exit 0)" in lines  # then its whole report
    assert "[root@gpu1] result: promoted (pass)" in lines
    assert any(ln.startswith("ledger: recorded the deploy of") for ln in lines)


def test_a_failed_deploys_log_blanks_the_secret_it_was_given(tmp_path: Path) -> None:
    secret = "s3cr3t-value-never-logged"
    gate = FakeGate(with_incumbent(), raises=InfraError(f"the server echoed {secret} back"))
    code, _, rep, log = _deploy(tmp_path, gate, secret)
    text = log.read_text()
    assert code == 4 and secret in (rep.cause or "")  # the report holds it; the log must not
    assert secret not in text and "the server echoed [redacted] back" in text


def test_a_rollouts_log_holds_every_host_step_and_its_table(tmp_path: Path) -> None:
    run = rollout(fake_fleet(), fleet_stack("swap"), tmp_path)
    assert run.code == 0
    (log,) = (tmp_path / "logs").iterdir()
    lines = [ln.partition(" ")[2] for ln in log.read_text().splitlines()]
    for h in ("h0", "h1", "h2"):
        for phase in ("converge", "preflight", "pull"):
            assert f"[{h}] {phase} ..." in lines and any(ln.startswith(f"[{h}] {phase} ok ") for ln in lines)
        for step in ("lock", "preflight", "start", "ready", "gate", "promote"):
            assert f"[{h}] {step} ..." in lines and any(ln.startswith(f"[{h}] {step} ok ") for ln in lines), (h, step)
        assert f"[{h}]   outcome: promoted (exit 0)" in lines  # its whole report
    assert "| h2 | 2 | promoted | pass |  |  |" in lines
    assert run.out[0].endswith(f"; every step in {log}") and run.out[-1].endswith(f"; every step in {log}")
    assert not any(ln.startswith("[h") for ln in run.out)  # nothing per step on the rollout's output


def test_a_deploys_summary_is_its_stage_times_and_the_steps_a_person_must_read() -> None:
    from stackbuild.host.outcome import Step as Done

    rep = DeployReport(host="root@gpu1", service="s", stack="sim", image="img", strategy="swap")
    secrets = "/etc/s.env: set A; neither given nor on the host, the server gets none: B"
    rep.steps = [Done("lock", True, 0.1, "broke a stale lock (deploy sim, pid 7)"), Done("state", True, 0.1),
                 Done("recover", True, 3.0, "an interrupted deploy of img0 was pending"),
                 Done("secrets", True, 0.2, secrets),
                 Done("start", True, 0.5, "s.service on port 1"), Done("ready", False, 60.0, "crashed: boom"),
                 Done("restore", True, 2.0, "s.service runs img0"), Done("verify serving", True, 1.0, "ready")]
    rep.outages = [(0.0, 3.5)]
    rep.finish("rolled-back", "candidate crashed on start: boom")
    assert rep.render(full=False).splitlines() == [
        "deploy sim -> root@gpu1 (s, swap)",
        "  image: img",
        "  took 66.90s: prepare 0.40s, recover 3.00s, start 60.50s, rollback 3.00s",
        "  ok   lock              0.10s  broke a stale lock (deploy sim, pid 7)",
        "  ok   recover           3.00s  an interrupted deploy of img0 was pending",
        "  ok   secrets           0.20s  /etc/s.env: set A; neither given nor on the host, the server gets none: B",
        "  FAIL ready            60.00s  crashed: boom",
        "  outcome: rolled-back (exit 1)",
        "  cause: candidate crashed on start: boom",
        "  downtime: 3.50s in 1 outage(s) (incumbent stop -> a server serving again)",
    ]
    assert len(rep.render().splitlines()) == 2 + 8 + 3  # the full form: every step, no stage times


def test_a_deploys_summary_shows_a_gate_that_passed_beside_a_busy_incumbent() -> None:
    from stackbuild.host.outcome import Step as Done

    busy = ("pass: C=1: the incumbent finished 274 request(s) of other clients during this level: a busy "
            "incumbent reads slower, so the candidate gains")
    for detail, shown in (("pass", False), (busy, True)):
        rep = DeployReport(host="root@gpu1", service="s", stack="sim", image="img", strategy="side-by-side")
        rep.steps = [Done("start", True, 0.5, "s.service on port 1"), Done("gate", True, 80.0, detail)]
        rep.verdict = "pass"
        rep.finish("promoted")
        assert (f"  ok   gate             80.00s  {busy}" in rep.render(full=False).splitlines()) == shown
