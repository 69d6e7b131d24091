"""flows.rollout_ops.RealOps and flows.fleet_status.read_fleet
on scripted FakeHosts (reached through helpers_fleet.FakeReach).

Each op opens its own connection to the host, as against real hosts; what it does there is
read back from the host.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers_deploy import CANDIDATE, INCUMBENT, PATHS, FakeGate
from helpers_fleet import FakeReach, fake_fleet, fleet_args, fleet_stack, look

from stackbuild.errors import InfraError
from stackbuild.flows.fleet_status import latest_rollout, read_fleet
from stackbuild.flows.rollout_ops import RealOps
from stackbuild.host.ssh import SshOptions
from stackbuild.host.state import LeaseOwner, Pending
from stackbuild.results.display import Event, Log, Note, Step
from stackbuild.results.ledger import Ledger
from stackbuild.spec.stack import Stack
from stackbuild.testing.fake_host import FakeHost, crashes


def ops_for(fakes: dict[str, FakeHost], stack: Stack, tmp: Path, **gates: object) -> tuple[RealOps, list[str]]:
    """The rollout's ops, its gateway brought up on h0 first (what a rollout does before any deploy),
    and what they said or logged about each host, one line each: `[host] text`."""
    out: list[str] = []

    def sink(ev: Event) -> None:
        if isinstance(ev, Note | Log):
            out.extend(f"[{ev.host}] {ln}" for ln in ev.text.splitlines())

    args = fleet_args(fakes, stack, tmp, gates)  # type: ignore[arg-type]
    ops = RealOps(run=args, hosts={h.name: h for h in stack.host.hosts}, image=CANDIDATE, sink=sink)
    assert ops.gateway() is None, out
    out.clear()
    return ops, out


def test_deploy_promotes_one_host_records_it_and_reports_its_medians(tmp_path: Path) -> None:
    fakes = fake_fleet()
    ops, out = ops_for(fakes, fleet_stack("swap"), tmp_path)
    assert ops.view("h1").on_candidate is False
    res = ops.deploy("h1")
    assert (res.outcome, res.exit_code, res.verdict) == ("promoted", 0, "pass")
    st = look(fakes["h1"])
    assert st.current is not None and st.current.image == CANDIDATE and st.previous is not None
    assert look(fakes["h0"]).current.image == INCUMBENT  # type: ignore[union-attr]
    v = ops.view("h1")
    assert (v.on_candidate, v.image, v.verdict, v.pending, v.active) == (True, CANDIDATE, "pass", False, True)
    assert out and all(ln.startswith("[h1] ") for ln in out)
    assert "[h1]   outcome: promoted (exit 0)" in out
    with Ledger(tmp_path / "ledger.db") as db:
        (d,) = db.deploys()
        (g,) = db.gate_runs()
    assert (d.host, d.outcome, d.digest) == ("root@h1", "promoted", CANDIDATE.split("@")[1])
    assert g.result.verdict == "pass"
    # a rollout's host does not draw the report: the rollout does, once, when it ends
    assert not (tmp_path / "report.md").exists()
    assert f"[h1] ledger: recorded the deploy of {CANDIDATE} to root@h1 (promoted) in {tmp_path / 'ledger.db'}" in out


def test_deploy_whose_gate_fails_is_rolled_back_on_that_host(tmp_path: Path) -> None:
    fakes = fake_fleet()
    gate = FakeGate(fakes["h2"], verdicts={CANDIDATE: "fail"})
    ops, _ = ops_for(fakes, fleet_stack("side-by-side"), tmp_path, h2=gate)
    res = ops.deploy("h2")
    assert (res.outcome, res.exit_code, res.verdict) == ("rolled-back", 1, "fail")
    assert look(fakes["h2"]).current.image == INCUMBENT  # type: ignore[union-attr]
    assert fakes["h2"].serving(31000) == INCUMBENT


def test_deploy_that_fails_with_a_bug_after_the_host_was_put_back_raises(tmp_path: Path) -> None:
    fakes = fake_fleet()
    gate = FakeGate(fakes["h0"], raises=RuntimeError("a bug in the gate"))
    ops, out = ops_for(fakes, fleet_stack("swap"), tmp_path, h0=gate)
    with pytest.raises(RuntimeError, match="a bug in the gate"):
        ops.deploy("h0")
    assert "[h0] deploy did not finish cleanly: a bug in the gate" in out
    assert look(fakes["h0"]).current.image == INCUMBENT  # type: ignore[union-attr]
    assert fakes["h0"].serving(31000) == INCUMBENT


def test_converge_puts_back_an_interrupted_deploy_and_says_what_it_did(tmp_path: Path) -> None:
    fakes = fake_fleet()
    h = fakes["h0"]
    st = look(h)
    pending = Pending(op="deploy", image=CANDIDATE, strategy="swap", owner="{}", started_at="t")
    h.files[PATHS.state_file] = st.model_copy(update={"pending": pending}).model_dump_json()
    ops, out = ops_for(fakes, fleet_stack("swap"), tmp_path)
    assert ops.converge("h0") is None
    assert out == [f"[h0] converged: put back an interrupted deploy of {CANDIDATE}"]
    assert look(h).pending is None and h.serving(31000) == INCUMBENT
    assert ops.converge("h1") is None and len(out) == 1  # nothing to converge: nothing said


def test_preflight_names_what_the_host_lacks(tmp_path: Path) -> None:
    fakes = fake_fleet()
    fakes["h1"].docker_version = None
    fakes["h2"].strangers.add(31001)  # the staging port, held by another process
    ops, _ = ops_for(fakes, fleet_stack("side-by-side"), tmp_path)
    assert ops.preflight("h0") is None
    assert ops.preflight("h1") == ("docker: docker is not usable: Cannot connect to the Docker daemon at "
                                   "unix:///var/run/docker.sock.; install/start it")
    assert ops.preflight("h2") == "port: port 31001 is in use by another process: free it or change runtime.port"


def test_pull_then_soak_holds_on_a_healthy_host_and_fails_on_a_crashing_one(tmp_path: Path) -> None:
    fakes = fake_fleet()
    fakes["h1"].servers[CANDIDATE] = crashes("Segmentation fault", after_s=30.0)
    ops, out = ops_for(fakes, fleet_stack("swap"), tmp_path)
    for h in ("h0", "h1"):
        assert ops.pull(h) is None and CANDIDATE in fakes[h].images
        assert ops.deploy(h).outcome == "promoted"
    assert ops.soak("h0", 10.0, 1.0) is None
    assert "[h0] soak: held: 11 samples healthy over 10s" in out
    t0 = fakes["h1"].now
    why = ops.soak("h1", 60.0, 1.0)
    assert why == "unit is activating"  # systemd restarts it (Restart=on-failure)
    assert fakes["h1"].now - t0 < 40.0  # the first regression ends the soak, on the host's clock


def test_revert_puts_the_incumbent_back(tmp_path: Path) -> None:
    fakes = fake_fleet()
    ops, out = ops_for(fakes, fleet_stack("swap"), tmp_path)
    assert ops.deploy("h2").outcome == "promoted"
    assert ops.revert("h2") is None
    st = look(fakes["h2"])
    assert st.current is not None and st.current.image == INCUMBENT and st.previous.image == CANDIDATE  # type: ignore[union-attr]
    assert fakes["h2"].serving(31000) == INCUMBENT
    assert out[-1] == "[h2] reverted to the incumbent: manual rollback"


def test_each_host_gets_its_stack_without_the_channel_and_its_class(tmp_path: Path) -> None:
    stack = fleet_stack("swap")
    stack = stack.model_copy(update={"host": stack.host.model_copy(update={"channel": "stable"})})
    ops, _ = ops_for(fake_fleet(), stack, tmp_path)
    assert ops.stack_of("h1").host.channel is None  # the channel moves once, when the rollout completed
    assert ops.host_class("h1") == "no GPU"


def test_an_unreachable_host_fails_its_op(tmp_path: Path) -> None:
    fakes = fake_fleet()
    ops, _ = ops_for(fakes, fleet_stack("swap"), tmp_path)
    assert isinstance(ops.run.reach, FakeReach)
    ops.run.reach.down.add("h1")
    with pytest.raises(Exception, match="cannot connect to h1"):
        ops.preflight("h1")


# --- status --fleet -----------------------------------------------------------------------------


def test_read_fleet_reports_each_hosts_release_lock_pending_and_the_unreachable(tmp_path: Path) -> None:
    fakes = fake_fleet()
    owner = LeaseOwner("ci-runner", 4242, time.time() - 30, "deploy sim")
    fakes["h0"].dirs[PATHS.lease_dir] = fakes["h0"].now
    fakes["h0"].files[f"{PATHS.lease_dir}/owner.json"] = owner.to_json()
    st = look(fakes["h1"])
    pending = Pending(op="rollback", image=CANDIDATE, strategy="swap", owner="{}", started_at="t")
    fakes["h1"].files[PATHS.state_file] = st.model_copy(update={"pending": pending}).model_dump_json()
    stack = fleet_stack("swap")
    reach = FakeReach(fakes, down={"h2"})
    rows = {r.host: r for r in read_fleet(stack, SshOptions(), None, None, reach)}
    h0, h1, h2 = rows["h0"], rows["h1"], rows["h2"]
    assert (h0.service, h0.active, h0.enabled, h0.image, h0.release, h0.verdict, h0.pending) == (
        "stackbuild-sim", True, "enabled", INCUMBENT, "sim", "pass", None)
    assert h0.lock is not None and h0.lock.startswith("deploy sim by pid 4242 on ci-runner, started ")
    assert (h1.lock, h1.pending) == (None, f"rollback of {CANDIDATE}")
    assert h2.error == "cannot connect to h2 over SSH: Connection refused" and not h2.active
    assert [r.host for r in read_fleet(stack, SshOptions(), ["h1"], None, reach)] == ["h1"]


def test_latest_rollout_is_the_stacks_last(tmp_path: Path) -> None:
    stack = fleet_stack("swap")
    path = tmp_path / "ledger.db"
    assert latest_rollout(path, stack) is None and not path.exists()  # no ledger: none, and none made
    with Ledger(path) as db:
        for rid, name in (("r1", "sim"), ("r2", "sim-eagle"), ("r3", "other")):
            db.start_rollout(id=rid, stack=name, image=CANDIDATE, digest="d", policy="halt", plan=[["h0"]])
    last = latest_rollout(path, stack)
    assert last is not None and last.id == "r2"


def test_a_rollout_refreshes_the_report_once_when_it_ends(tmp_path: Path) -> None:
    from helpers_fleet import rollout

    fakes = fake_fleet()
    run = rollout(fakes, fleet_stack("swap"), tmp_path)
    assert run.code == 0
    (log,) = (tmp_path / "logs").iterdir()  # what the ledger recorded goes to the rollout's step log
    reports = [ln.partition(" ")[2] for ln in log.read_text().splitlines() if " report: " in ln]
    assert reports == [f"report: {tmp_path / 'report.md'}"]
    assert (tmp_path / "report.md").read_text().count("| sim |") >= 1


def test_a_hosts_ledger_rows_go_to_the_log_and_a_row_not_recorded_to_the_screen(tmp_path: Path) -> None:
    fakes = fake_fleet()
    said: list[Event] = []
    ledger = tmp_path / "ledger.db"

    def gate(*a: object) -> object:
        ledger.write_bytes(b"not a database" * 100)  # clobbered while the candidate is gated
        return FakeGate(fakes["h1"])(*a)  # type: ignore[arg-type]

    stack = fleet_stack("swap", gateway=False)  # the host's own deploy, not the gateway's drain around it
    ops = RealOps(run=fleet_args(fakes, stack, tmp_path, {"h1": gate}),
                  hosts={h.name: h for h in stack.host.hosts}, image=CANDIDATE, sink=said.append)
    assert ops.deploy("h1").outcome == "promoted"
    notes = [e for e in said if isinstance(e, Note)]
    assert len(notes) == 1 and notes[0].host == "h1"
    assert notes[0].text.startswith(f"stackbuild: ledger: the deploy of {CANDIDATE} to root@h1 (promoted) NOT recorded")
    assert any(isinstance(e, Log) and e.text.startswith("deploy sim -> root@h1") for e in said)  # its whole report


def test_each_phase_on_a_host_is_told_as_it_starts_and_ends_with_why_it_failed(tmp_path: Path) -> None:
    fakes = fake_fleet()
    fakes["h1"].docker_version = None
    said: list[Event] = []
    stack = fleet_stack("swap")
    args = fleet_args(fakes, stack, tmp_path, {})
    args.reach.down.add("h2")  # type: ignore[attr-defined]
    ops = RealOps(run=args, hosts={h.name: h for h in stack.host.hosts}, image=CANDIDATE, sink=said.append)
    assert ops.preflight("h0") is None and ops.preflight("h1") is not None
    with pytest.raises(InfraError):
        ops.pull("h2")
    ends = [(e.host, e.name, e.ok, e.detail) for e in said if isinstance(e, Step) and e.ok is not None]
    assert ends == [("h0", "preflight", True, ""),
                    ("h1", "preflight", False, "docker: docker is not usable: Cannot connect to the Docker daemon "
                     "at unix:///var/run/docker.sock.; install/start it"),
                    ("h2", "pull", False, "cannot connect to h2 over SSH: Connection refused")]
    assert all(e.phase for e in said if isinstance(e, Step))  # the rollout announces these, not each host
