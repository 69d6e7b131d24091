"""results.recorder: one way into the ledger, one error policy. A bad ledger stops an operation
before it starts (exit 2); once the operation has an outcome, a failed write is one warning line
and the outcome (and its exit code) stand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers_deploy import CANDIDATE, D_CAND, REPO, FakeGate, gate_result, sim_stack, with_incumbent
from helpers_fleet import FakeReach, look

from stackbuild.errors import InputError
from stackbuild.flows.deploy_host import DeployArgs, resolve_image, run_deploy
from stackbuild.host.ssh import SshOptions
from stackbuild.image.build import BuildResult
from stackbuild.results.ledger import Ledger
from stackbuild.results.recorder import Recorder

GARBAGE = b"this is not sqlite " * 100


def built(digest: str = D_CAND) -> BuildResult:
    return BuildResult(image=f"{REPO}:sim-abc", tag="sim-abc", hash="abc", image_id=None, digest=digest,
                       skipped=False, lock={"hf_token": "hf_" + "x" * 20, "torch": "2.9"})


def recorder(tmp_path: Path) -> tuple[Recorder, list[str]]:
    lines: list[str] = []
    return Recorder(tmp_path / "ledger.db", note=lines.append), lines


def test_a_build_is_recorded_once_with_its_lock_redacted_and_the_report_refreshed(tmp_path: Path) -> None:
    rec, lines = recorder(tmp_path)
    rec.build(sim_stack(), built())
    rec.build(sim_stack(), built())  # the same digest again: no new row, nothing said
    with Ledger(rec.path) as db:
        (b,) = db.builds()
    assert (b.stack, b.image, b.digest, b.content_hash, b.lock) == (
        "sim", f"{REPO}:sim-abc", D_CAND, "abc", {"hf_token": "[redacted]", "torch": "2.9"})
    assert lines == [f"ledger: recorded the build of {REPO}:sim-abc in {rec.path}",
                     f"report: {tmp_path / 'report.md'}"]
    assert (tmp_path / "report.md").is_file()


def test_a_bad_ledger_stops_the_operation_before_it_starts(tmp_path: Path) -> None:
    rec, _ = recorder(tmp_path)
    rec.path.write_bytes(GARBAGE)
    with pytest.raises(InputError, match="not a stackbuild ledger") as err:
        rec.check()
    assert err.value.exit_code == 2
    with pytest.raises(InputError, match="not a stackbuild ledger"):
        rec.start_rollout(id="r1", stack="sim", image=CANDIDATE, digest=D_CAND, policy="halt", plan=[["h0"]])


def test_after_the_outcome_a_failed_write_is_one_warning_line(tmp_path: Path) -> None:
    rec, lines = recorder(tmp_path)
    log = rec.start_rollout(id="r1", stack="sim", image=CANDIDATE, digest=D_CAND, policy="halt", plan=[["h0"]])
    rec.path.write_bytes(GARBAGE)  # broken while the operation ran
    rec.gate(gate_result("pass", name="cand"))
    log.finish("completed", None)
    assert len(lines) == 2 and all(ln.startswith("stackbuild: ledger: ") for ln in lines), lines
    assert lines[0].startswith(f"stackbuild: ledger: cand NOT recorded in {rec.path} ({rec.path}: not a stackbuild")
    assert lines[0].endswith("; the outcome stands")
    assert not (tmp_path / "report.md").exists()


def test_warnings_go_to_their_own_channel_when_given_one(tmp_path: Path) -> None:
    said: list[str] = []
    warned: list[str] = []
    rec = Recorder(tmp_path / "ledger.db", note=said.append, warn=warned.append)
    (tmp_path / "report.md").mkdir()  # the report's name is taken by a directory
    rec.gate(gate_result("pass", name="cand"))
    rec.path.write_bytes(GARBAGE)
    rec.gate(gate_result("pass", name="cand2"))
    assert said == [f"ledger: recorded cand in {rec.path}"]  # a rollout logs these; it shows the warnings
    assert [w.split(" (", 1)[0] for w in warned] == [
        "stackbuild: report: not updated", f"stackbuild: ledger: cand2 NOT recorded in {rec.path}"]


def test_a_report_that_cannot_be_written_is_a_warning_and_the_row_stays(tmp_path: Path) -> None:
    rec, lines = recorder(tmp_path)
    (tmp_path / "report.md").mkdir()  # the report's name is taken by a directory
    rec.gate(gate_result("pass", name="cand"))
    assert lines[0] == f"ledger: recorded cand in {rec.path}"
    assert lines[1].startswith("stackbuild: report: not updated (") and lines[1].endswith(
        "`stackbuild report` writes it again")
    assert len(lines) == 2
    with Ledger(rec.path) as db:
        assert [g.result.name for g in db.gate_runs()] == ["cand"]


def test_a_rollouts_rows_do_not_refresh_the_report_its_end_does(tmp_path: Path) -> None:
    rec, lines = recorder(tmp_path)
    log = rec.start_rollout(id="r1", stack="sim", image=CANDIDATE, digest=D_CAND, policy="halt", plan=[["h0"]])

    class Row:
        host, wave, outcome, verdict, detail, flagged, medians = "h0", 0, "promoted", "pass", "", None, {8: 99.5}

    log.host(Row())
    assert lines == []
    log.finish("completed", None)
    assert lines == [f"ledger: recorded rollout r1 (completed) in {rec.path}", f"report: {tmp_path / 'report.md'}"]
    with Ledger(rec.path) as db:
        (r,) = db.rollouts()
    assert (r.outcome, [(h.host, h.outcome, h.medians) for h in r.hosts]) == (
        "completed", [("h0", "promoted", {8: 99.5})])


def _args(tmp_path: Path, reach: FakeReach, **kw: Any) -> DeployArgs:
    stack = sim_stack()
    # no registry here: no channel to move, no gateway image to build (the ledger is what is tested)
    stack = stack.model_copy(update={"host": stack.host.model_copy(update={"channel": None}), "gateway": None})
    return DeployArgs(stack=stack, ssh=SshOptions(), host_text="h0", strategy="swap", ledger=tmp_path / "l.db",
                      root=tmp_path, tunnel=False, reach=reach, **kw)


def test_an_image_a_deploy_builds_reaches_the_builds_table(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []

    def build(stack: Any, **kw: Any) -> BuildResult:
        calls.append(kw)
        return built()

    out: list[str] = []
    args = _args(tmp_path, FakeReach({}), registry=REPO)
    assert resolve_image(args, out.append, build=build) == (f"{REPO}@{D_CAND}", D_CAND)
    assert calls == [{"registry": REPO, "push": True}]
    with Ledger(tmp_path / "l.db") as db:
        assert [(b.image, b.digest) for b in db.builds()] == [(f"{REPO}:sim-abc", D_CAND)]
    assert out[:2] == [f"built {REPO}:sim-abc ({D_CAND})", f"ledger: recorded the build of {REPO}:sim-abc in "
                                                           f"{tmp_path / 'l.db'}"]


def test_a_deploy_whose_ledger_breaks_meanwhile_still_exits_with_its_outcome(tmp_path: Path) -> None:
    host = with_incumbent()
    ledger = tmp_path / "l.db"

    def gate(*a: Any) -> Any:
        ledger.write_bytes(GARBAGE)  # someone clobbers the ledger while the candidate is gated
        return FakeGate(host)(*a)

    out: list[str] = []
    code = run_deploy(_args(tmp_path, FakeReach({"h0": host}, {"h0": gate}), image=CANDIDATE), echo=out.append)
    assert code == 0
    st = look(host)
    assert st.current is not None and st.current.image == CANDIDATE
    i = next(i for i, ln in enumerate(out) if "outcome: promoted (exit 0)" in ln)
    warn = [ln for ln in out if ln.startswith("stackbuild: ledger: ")]
    assert len(warn) == 1 and out.index(warn[0]) > i and "NOT recorded" in warn[0]
