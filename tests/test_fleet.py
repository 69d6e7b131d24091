"""Fleet rollout core: wave planning, wave decisions, outliers, soak judging, and the
orchestration against a fake of FleetOps (exact calls and outcomes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stackbuild.cli.main import main
from stackbuild.errors import InputError, SpecError
from stackbuild.fleet.inventory import host_stack, load_inventory, select
from stackbuild.fleet.plan import decide_wave, host_class, outliers, plan_waves, remaining, spread
from stackbuild.fleet.rollout import DeployResult, HostRow, HostView, Settings, run_rollout
from stackbuild.fleet.soak import Sample, judge, parse_counters, soak
from stackbuild.spec.fleet import Fleet, FleetHost
from stackbuild.spec.load import load_stack

H = [f"h{i}" for i in range(8)]


# --- plan ---------------------------------------------------------------------------


@pytest.mark.parametrize("n, steps, maxp, want", [
    (8, (1, "25%", "100%"), None, [["h0"], ["h1"], ["h2", "h3", "h4", "h5", "h6", "h7"]]),
    (3, (1, "100%"), None, [["h0"], ["h1", "h2"]]),
    (8, (1, "100%"), 3, [["h0"], ["h1", "h2", "h3"], ["h4", "h5", "h6"], ["h7"]]),
    (1, (1, "25%", "100%"), None, [["h0"]]),
    (5, (3,), None, [["h0"], ["h1", "h2"], ["h3", "h4"]]),  # canary alone; last wave reaches all
    (4, ("50%", "50%", 2, "100%"), None, [["h0"], ["h1"], ["h2", "h3"]]),  # steps adding no host dropped
    (0, (1, "100%"), None, []),
])
def test_plan_waves(n: int, steps: tuple[int | str, ...], maxp: int | None, want: list[list[str]]) -> None:
    assert plan_waves(H[:n], steps, maxp) == want


def test_remaining_resumes_at_the_first_wave_with_hosts_left() -> None:
    waves = [["h0"], ["h1", "h2"], ["h3"]]
    assert remaining(waves, {"h0", "h1"}) == [(1, ["h2"]), (2, ["h3"])]
    assert remaining(waves, set(H)) == []


def test_decide_wave_by_policy() -> None:
    ok = decide_wave({"h1": "promoted", "h2": "promoted"}, ["h0"], "halt")
    assert (ok.go_on, ok.failed, ok.revert) == (True, (), ())
    halt = decide_wave({"h1": "promoted", "h2": "rolled-back"}, ["h0"], "halt")
    assert (halt.go_on, halt.failed, halt.revert) == (False, ("h2",), ("h1",))
    assert "earlier waves stay" in halt.why
    back = decide_wave({"h1": "promoted", "h2": "rolled-back"}, ["h0"], "rollback_all")
    assert back.revert == ("h1", "h0")
    soaked = decide_wave({"h1": "soak-failed", "h2": "promoted"}, [], "halt",
                         on_candidate=("promoted", "soak-failed"))
    assert (soaked.failed, soaked.revert) == (("h1",), ("h1", "h2"))


def test_outliers_against_the_canary() -> None:
    ref = {1: 100.0, 8: 400.0}
    got = outliers(ref, {"h1": {1: 95.0, 8: 410.0}, "h2": {1: 100.0, 8: 250.0}, "h3": {}}, 0.1)
    assert list(got) == ["h2"]
    assert got["h2"] == ("C=8: 250.0 tok/s is 0.62x the canary's 400.0 "
                         "(allowed 10%: class tolerance or the runs' own spread)")
    # within the noise both gates measured, a 20% gap is not a sick host; beyond it, it is
    noisy = {"": {1: 0.15}, "h1": {1: 0.1}}
    assert outliers(ref, {"h1": {1: 120.0}}, 0.1, noisy) == {}
    assert list(outliers(ref, {"h1": {1: 130.0}}, 0.1, noisy)) == ["h1"]


def test_spread_and_host_class() -> None:
    assert spread([90.0, 100.0, 110.0]) == pytest.approx(0.2)
    assert spread([5.0]) == 0.0
    assert host_class("none", None, None) == "no GPU"
    assert host_class(8, "RTX PRO 6000", "580.65") == "8x RTX PRO 6000, driver 580.65"


def test_fleet_model_rejects_bad_waves() -> None:
    for bad in ((), (0,), ("150%",), ("x",), (True,)):
        with pytest.raises(ValueError):
            Fleet(waves=bad)
    assert Fleet(waves=(1, "25%", "100%")).on_failure == "halt"


# --- soak ---------------------------------------------------------------------------


def _s(**kw: object) -> Sample:
    base: dict[str, object] = {"health_status": 200, "generate_ok": True, "generate_detail": "ok",
                               "counters": {"sglang:num_requests_total": 10.0}}
    base.update(kw)
    return Sample(**base)  # type: ignore[arg-type]


def test_parse_counters_sums_label_sets() -> None:
    text = ('# TYPE sglang:num_requests_total counter\n'
            'sglang:num_requests_total{model_name="m",is_streaming="true"} 3.0\n'
            'sglang:num_requests_total{model_name="m",is_streaming="false"} 2.0\n'
            'sglang:num_running_reqs{model_name="m"} 4.0\n'
            'sglang:num_aborted_requests_total 1\n')
    assert parse_counters(text) == {"sglang:num_requests_total": 5.0, "sglang:num_aborted_requests_total": 1.0}


def test_judge_names_each_regression() -> None:
    first = _s(counters={"sglang:num_requests_total": 10.0, "sglang:num_aborted_requests_total": 0.0})
    assert judge(first, _s(counters={"sglang:num_requests_total": 12.0,
                                     "sglang:num_aborted_requests_total": 0.0})) == []
    assert judge(first, _s(health_status=None, generate_ok=False, generate_detail="refused", active="activating",
                           restarts=1, counters={"sglang:num_requests_total": 2.0,
                                                 "sglang:num_aborted_requests_total": 3.0})) == [
        "unit is activating",
        "systemd restarted the server 1 time(s)",
        "/health_generate answered nothing",
        "a generation failed: refused",
        "sglang:num_aborted_requests_total rose by 3",
        "sglang:num_requests_total went down (10 -> 2): the server restarted",
    ]


def test_soak_stops_at_the_first_regression() -> None:
    t = [0.0]
    samples = iter([_s(), _s(), _s(health_status=503), _s()])
    res = soak(lambda: next(samples), 10.0, 1.0, clock=lambda: t[0],
               sleep=lambda s: t.__setitem__(0, t[0] + s))
    assert (res.ok, res.samples, res.detail) == (False, 3, "/health_generate answered 503")
    t[0] = 0.0
    res = soak(_s, 3.0, 1.0, clock=lambda: t[0], sleep=lambda s: t.__setitem__(0, t[0] + s))
    assert (res.ok, res.samples) == (True, 4)


# --- orchestration against a fake -------------------------------------------------------


@dataclass
class FakeOps:
    unreachable: set[str] = field(default_factory=set)
    fail: dict[str, str] = field(default_factory=dict)  # host -> outcome of its deploy
    soak_bad: set[str] = field(default_factory=set)
    on_candidate: set[str] = field(default_factory=set)
    medians: dict[str, dict[int, float]] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)

    def converge(self, host: str) -> str | None:
        self.calls.append(("converge", host))
        return None

    def preflight(self, host: str) -> str | None:
        self.calls.append(("preflight", host))
        return "ssh: connection refused" if host in self.unreachable else None

    def gateway(self) -> str | None:
        return None

    def view(self, host: str) -> HostView:
        return HostView(on_candidate=host in self.on_candidate, verdict="pass")

    def pull(self, host: str) -> str | None:
        self.calls.append(("pull", host))
        return None

    def deploy(self, host: str) -> DeployResult:
        self.calls.append(("deploy", host))
        if host == "boom":
            raise RuntimeError("ssh died")
        outcome = self.fail.get(host, "promoted")
        if outcome == "promoted":
            self.on_candidate.add(host)
        return DeployResult(outcome, 0 if outcome == "promoted" else 1, "pass" if outcome == "promoted" else "fail",
                            None if outcome == "promoted" else "gate fail", self.medians.get(host, {1: 100.0}))

    def soak(self, host: str, seconds: float, interval_s: float) -> str | None:
        self.calls.append(("soak", host))
        return "a generation failed" if host in self.soak_bad else None

    def revert(self, host: str) -> str | None:
        self.calls.append(("revert", host))
        self.on_candidate.discard(host)
        return None

    def host_class(self, host: str) -> str:
        return "1x sim"


@dataclass
class ListRecorder:
    rows: dict[str, HostRow] = field(default_factory=dict)
    finished: tuple[str, str | None] | None = None

    def host(self, row: HostRow) -> None:
        self.rows[row.host] = row

    def finish(self, outcome: str, cause: str | None) -> None:
        self.finished = (outcome, cause)


WAVES = [["h0"], ["h1", "h2"], ["h3"]]


def _run(ops: FakeOps, **kw: object) -> tuple[object, ListRecorder]:
    rec = ListRecorder()
    res = run_rollout(WAVES, ops, Settings(**kw), rec, echo=lambda s: None)  # type: ignore[arg-type]
    return res, rec


def _deploys(ops: FakeOps) -> list[str]:
    return [h for what, h in ops.calls if what == "deploy"]


def test_all_waves_pass() -> None:
    ops = FakeOps()
    res, rec = _run(ops)
    assert (res.outcome, res.exit_code) == ("completed", 0)  # type: ignore[attr-defined]
    assert sorted(_deploys(ops)[1:3]) == ["h1", "h2"] and _deploys(ops)[0] == "h0" and _deploys(ops)[3] == "h3"
    assert {h: r.outcome for h, r in rec.rows.items()} == dict.fromkeys(["h0", "h1", "h2", "h3"], "promoted")
    assert rec.finished is not None and rec.finished[0] == "completed"


def test_unreachable_host_refuses_before_any_pull_or_deploy() -> None:
    ops = FakeOps(unreachable={"h3"})
    res, rec = _run(ops)
    assert (res.outcome, res.exit_code) == ("refused", 4)  # type: ignore[attr-defined]
    assert [w for w, _ in ops.calls] == ["converge"] * 4 + ["preflight"] * 4
    assert rec.rows["h3"].outcome == "refused" and rec.rows["h0"].outcome == "untouched"


def test_canary_failure_touches_nothing_else() -> None:
    ops = FakeOps(fail={"h0": "rolled-back"})
    res, rec = _run(ops, policy="rollback_all")
    assert (res.outcome, res.exit_code) == ("stopped", 1)  # type: ignore[attr-defined]
    assert _deploys(ops) == ["h0"]
    assert not [c for c in ops.calls if c[0] == "revert"]
    assert [rec.rows[h].outcome for h in ("h0", "h1", "h2", "h3")] == ["rolled-back", "untouched", "untouched",
                                                                        "untouched"]


@pytest.mark.parametrize("policy, reverted, h0", [("halt", ["h1"], "promoted"),
                                                  ("rollback_all", ["h0", "h1"], "reverted")])
def test_later_wave_failure_by_policy(policy: str, reverted: list[str], h0: str) -> None:
    ops = FakeOps(fail={"h2": "rolled-back"})
    res, rec = _run(ops, policy=policy)
    assert (res.outcome, res.exit_code) == ("stopped", 1)  # type: ignore[attr-defined]
    assert sorted(h for w, h in ops.calls if w == "revert") == reverted
    assert "h3" not in _deploys(ops)
    assert [rec.rows[h].outcome for h in ("h0", "h1", "h2", "h3")] == [h0, "reverted", "rolled-back", "untouched"]
    assert ops.on_candidate == ({"h0"} if policy == "halt" else set())


def test_soak_regression_reverts_the_wave() -> None:
    ops = FakeOps(soak_bad={"h2"})
    res, rec = _run(ops, soak_s=5.0)
    assert res.outcome == "stopped"  # type: ignore[attr-defined]
    assert sorted(h for w, h in ops.calls if w == "revert") == ["h1", "h2"]
    assert (rec.rows["h1"].outcome, rec.rows["h2"].outcome) == ("reverted", "soak-failed")
    assert rec.rows["h2"].detail == "soak: a generation failed; put back to the incumbent"


def test_resume_skips_hosts_on_the_candidate() -> None:
    ops = FakeOps(on_candidate={"h0", "h1"})
    res, rec = _run(ops, policy="rollback_all")
    assert res.outcome == "completed"  # type: ignore[attr-defined]
    assert _deploys(ops) == ["h2", "h3"]
    assert [h for w, h in ops.calls if w == "pull"] == ["h2", "h3"]
    assert (rec.rows["h0"].outcome, rec.rows["h1"].outcome) == ("already", "already")


def test_resumed_failure_with_rollback_all_takes_back_earlier_runs_hosts_too() -> None:
    ops = FakeOps(on_candidate={"h0", "h1"}, fail={"h2": "rolled-back"})
    _run(ops, policy="rollback_all")
    assert sorted(h for w, h in ops.calls if w == "revert") == ["h0", "h1"]


def test_a_deploy_that_raises_fails_its_wave_as_infrastructure() -> None:
    ops = FakeOps()
    rec = ListRecorder()
    res = run_rollout([["h0"], ["boom", "h1"]], ops, Settings(), rec, echo=lambda s: None)
    assert (res.outcome, res.exit_code) == ("stopped", 4)
    assert rec.rows["boom"].outcome == "failed" and rec.rows["boom"].detail == "deploy: ssh died"
    assert [h for w, h in ops.calls if w == "revert"] == ["h1"]


def test_outlier_is_flagged_not_failed() -> None:
    ops = FakeOps(medians={"h0": {1: 100.0}, "h1": {1: 101.0}, "h2": {1: 50.0}, "h3": {1: 99.0}})
    res, rec = _run(ops, outlier_tolerance=0.1)
    assert res.outcome == "completed"  # type: ignore[attr-defined]
    assert [h for h, r in rec.rows.items() if r.flagged] == ["h2"]


# --- inventory ---------------------------------------------------------------------------


def test_inventory_errors_point_into_the_file(tmp_path: Path) -> None:
    p = tmp_path / "inv.yaml"
    p.write_text("hosts:\n  - name: a\n    port: 99999\n  - name: b\n    sevice: x\nfleet:\n  waves: ['200%']\n")
    with pytest.raises(SpecError) as exc:
        load_inventory(p)
    lines = str(exc.value).splitlines()
    assert lines[0].startswith(f"{p}:3:11: error: hosts.0.port: Input should be less than or equal to 65535")
    assert lines[1].startswith(f"{p}:5:5: error: hosts.1.sevice: unknown key")
    assert lines[2].startswith(f"{p}:7:10: error: fleet.waves: wave '200%': write a percentage")


def test_host_stack_applies_overrides_and_select_by_name() -> None:
    stack = load_stack("sim")
    h = FleetHost(name="b", address="root@10.0.0.2", port=32000, service="sim-b", flags={"--speed": 5})
    hs = host_stack(stack, h)
    assert (hs.runtime.port, hs.runtime.staging_port, hs.host.service, hs.host.address) == (
        32000, stack.runtime.staging_port, "sim-b", "root@10.0.0.2")
    assert hs.server.flags["--speed"] == 5 and hs.server.flags["--profile"] == "baseline"
    a = FleetHost(name="a")
    assert [x.name for x in select([a, h], ["b", "root@c:22"], "s")] == ["b", "root@c:22"]
    with pytest.raises(InputError):
        select([], None, "s")
    with pytest.raises(InputError):
        select([a, h], ["a", "a"], "s")


# --- ledger and CLI boundary ---------------------------------------------------------------


def test_ledger_rollouts_round_trip_and_resume_order(tmp_path: Path) -> None:
    from stackbuild.results.ledger import Ledger

    with Ledger(tmp_path / "l.db") as db:
        db.start_rollout(id="r1", stack="s-good", image="i@sha256:1", digest="sha256:1", policy="halt",
                         plan=[["a"], ["b"]])
        db.record_rollout_host("r1", host="a", wave=0, outcome="promoted", verdict="pass", detail="",
                               flagged=None, medians={4: 120.5})
        db.start_rollout(id="r2", stack="s", image="i@sha256:2", digest="sha256:2", policy="halt", plan=[["a"]])
        db.finish_rollout("r2", "completed", None)
        db.record_rollout_host("r1", host="a", wave=0, outcome="reverted", verdict="pass", detail="hf_" + "a" * 20,
                               flagged=None, medians={4: 120.5})
        db.start_rollout(id="r1", stack="s-good", image="i@sha256:1", digest="sha256:1", policy="rollback_all",
                         plan=[["a"], ["b"]])  # resumed: last by activity, running again
        got = db.rollouts()
    assert [(r.id, r.outcome, r.policy) for r in got] == [("r2", "completed", "halt"),
                                                          ("r1", "running", "rollback_all")]
    (a,) = got[1].hosts
    assert (a.host, a.outcome, a.medians, a.detail) == ("a", "reverted", {4: 120.5}, "[redacted]")


def test_a_rollout_resumed_under_another_plan_keeps_only_its_hosts_rows(tmp_path: Path) -> None:
    from stackbuild.results.ledger import Ledger

    with Ledger(tmp_path / "l.db") as db:
        db.start_rollout(id="r1", stack="s", image="i@sha256:1", digest="sha256:1", policy="halt",
                         plan=[["a"], ["b", "gone"]])
        for h in ("a", "gone"):
            db.record_rollout_host("r1", host=h, wave=0, outcome="refused", verdict=None, detail="", flagged=None,
                                   medians={})
        db.start_rollout(id="r1", stack="s", image="i@sha256:1", digest="sha256:1", policy="halt",
                         plan=[["a"], ["b"]])
        (r,) = db.rollouts()
    assert (r.plan, [h.host for h in r.hosts]) == ([["a"], ["b"]], ["a"])


def test_cli_fleet_input_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # in-process: main's one error handler is what turns these into one line, exit 2
    def run(*args: str) -> tuple[int, str]:
        rc = main(list(args))
        return rc, capsys.readouterr().err

    rc, err = run("deploy", "sim", "--fleet", "--image", "r@sha256:" + "0" * 64)
    assert rc == 2 and "no fleet: list hosts under host.hosts" in err
    rc, err = run("deploy", "sim", "--hosts", "a,b")
    assert rc == 2 and "--hosts/--inventory need --fleet" in err
    bad = tmp_path / "inv.yaml"
    bad.write_text("hosts:\n  - name: 'bad name'\n")
    rc, err = run("deploy", "sim", "--fleet", "--inventory", str(bad), "--image", "r@sha256:" + "0" * 64)
    assert rc == 2 and err.startswith(f"{bad}:2:11: error: hosts.0.name:")
    assert "Traceback" not in err
    flagged = tmp_path / "flags.yaml"
    flagged.write_text("hosts:\n  - name: a\n    flags: {--no-such-flag: 1}\n")
    rc, err = run("deploy", "sim", "--fleet", "--inventory", str(flagged), "--image", "r@sha256:" + "0" * 64)
    assert rc == 2, err
    assert f"{flagged}: error: host a: server.flags: '--no-such-flag' is not a simulator option" in err


@pytest.mark.parametrize("name, write, where, what", [
    ("utf16", lambda p: p.write_text("hosts:\n  - name: a\n", encoding="utf-16"), "1:1",
     "byte 0xff is not UTF-8; save the file as UTF-8 [file]"),
    ("newline", lambda p: p.write_text('hosts:\n  - name: a\n    address: "root@gpu1\\nrm -rf /"\n'), "3:14",
     "hosts.0.address: control character(s) '\\n' not allowed; keep the value on one line of printable text [kind]"),
    ("kind", lambda p: p.write_text("hosts:\n  - name: a\n    address: 'root@gpu 1'\n"), "3:14",
     "hosts.0.address: not [USER@]HOST[:PORT] (e.g. root@gpu1:22, or an ~/.ssh/config alias) [inventory]"),
])
def test_an_inventory_is_a_spec_refused_before_any_rollout_is_recorded(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, write: object, where: str, what: str) -> None:
    inv, ledger = tmp_path / f"{name}.yaml", tmp_path / "ledger.db"
    write(inv)  # type: ignore[operator]
    rc = main(["deploy", "sim", "--fleet", "--inventory", str(inv), "--image", "r@sha256:" + "0" * 64,
               "--ledger", str(ledger)])
    out, err = capsys.readouterr()
    assert (rc, out, err) == (2, "", f"{inv}:{where}: error: {what}\n")
    assert not ledger.exists()  # nothing recorded, and no host was reached (none is named that could be)


def test_hosts_words_that_are_not_declared_must_be_addresses() -> None:
    with pytest.raises(InputError) as err:
        select([FleetHost(name="a")], ["a", "root@gpu1\nx"], "s")
    assert str(err.value) == ("--hosts 'root@gpu1\\nx': neither a host of the fleet nor an address: control "
                              "character(s) '\\n' not allowed; write [USER@]HOST[:PORT]")


def test_fleet_status_table() -> None:
    from stackbuild.flows.fleet_status import HostStatusRow, render
    from stackbuild.results.ledger import RolloutHostRecord, RolloutRecord

    rows = [HostStatusRow("h0", "svc0", True, "r@sha256:" + "a" * 64, "sim-good", "pass", None, None,
                          enabled="enabled"),
            HostStatusRow("h1", "-", False, None, None, None, None, None, error="SSH to h1: refused"),
            HostStatusRow("h2", "svc2", True, "r@sha256:" + "b" * 64, "sim", "pass", None, None, enabled="disabled")]
    last = RolloutRecord("r1", "t0", "t1", "sim-good", "r@sha256:" + "a" * 64, "sha256:" + "a" * 64, "halt",
                         [["h0"], ["h1"]], "stopped", "wave 1 failed",
                         [RolloutHostRecord("h0", 0, "promoted", "pass", "", "C=8: off", {8: 1.0})])
    assert render(rows, last).splitlines() == [
        "| host | service | active | on boot | release | digest | last verdict | pending | lock |",
        "|---|---|---|---|---|---|---|---|---|",
        "| h0 | svc0 | active | starts | sim-good | sha256:aaaaaaaaaaaa | pass |  |  |",
        "| h1 | - | UNREACHABLE | | | | | | SSH to h1: refused |",
        "| h2 | svc2 | active | NOT started (disabled) | sim | sha256:bbbbbbbbbbbb | pass |  |  |",
        "",
        "last rollout r1 of sim-good (sha256:aaaaaaaaaaaa): stopped, on_failure=halt: wave 1 failed",
        "  h0: promoted (pass) FLAGGED",
    ]


# --- one machine, one place (issue #29) ----------------------------------------------------


def test_clashing_hosts_are_refused_at_the_line_that_clashes(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    inv, ledger = tmp_path / "inv.yaml", tmp_path / "ledger.db"
    inv.write_text("hosts:\n"
                   "  - {name: a, address: '127.0.0.1:2222', port: 34100, staging_port: 34100}\n"
                   "  - {name: b, address: 'root@127.0.0.1:2223'}\n"
                   "  - {name: c, address: '127.0.0.1:2223'}\n"
                   "  - {name: d, address: 'LOCALHOST', service: two, port: 40000, staging_port: 40001}\n"
                   "  - {name: e, address: 'localhost:22', service: three, port: 40001, staging_port: 40002}\n"
                   "  - {name: f, address: '127.0.0.1:2223', service: four, port: 41000, staging_port: 41001}\n")
    rc = main(["deploy", "sim", "--fleet", "--inventory", str(inv), "--image", "r@sha256:" + "0" * 64,
               "--ledger", str(ledger)])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, "")
    assert err.splitlines() == [
        f"{inv}:2:69: error: hosts.0: host a: staging_port 34100 is its port too; the candidate must bind a port "
        "the incumbent does not hold: give it another staging_port [addresses]",
        f"{inv}:4:12: error: hosts.2: host c is b again (address 127.0.0.1:2223, service stackbuild-sim): a host "
        "takes one place in a rollout; remove one, or give it its own service [addresses]",
        f"{inv}:6:62: error: hosts.4: host e shares port(s) 40001 with d on the same address localhost:22: give "
        "each service its own port and staging_port [addresses]",
    ]
    assert not ledger.exists()  # refused before a rollout was recorded or a host reached


def test_a_staging_port_on_the_port_is_a_spec_error(tmp_path: Path) -> None:
    from tests.helpers_spec import BASE, project

    root = project(tmp_path, {"s.yaml": BASE + "  port: 34100\n  staging_port: 34100\n"})
    with pytest.raises(SpecError) as exc:
        load_stack("s", root=root)
    assert [str(f) for f in exc.value.findings] == [
        f"{root / 'stacks' / 's.yaml'}:19:17: error: runtime.staging_port: staging_port 34100 is runtime.port too; "
        "the candidate must bind a port the incumbent does not hold: give it another staging_port (got 34100) [type]"]


def test_validate_says_what_deploy_fleet_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sim = Path(load_stack("sim").source).read_text()
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "s.yaml").write_text(sim.replace("host:\n", "host:\n  inventory: inv.yaml\n", 1))
    (tmp_path / "inv.yaml").write_text("- {name: a, address: gpu1}\n- {name: b, address: 'root@gpu1:22'}\n")
    rc = main(["--root", str(tmp_path), "validate", "s", "--offline"])
    err = capsys.readouterr().err
    assert rc == 2
    assert (f"{tmp_path / 'inv.yaml'}:2:10: error: hosts.1: host b is a again (address gpu1:22, service "
            "stackbuild-sim): a host takes one place in a rollout") in err


def test_the_same_machine_twice_on_the_command_line_is_refused() -> None:
    from stackbuild.fleet.inventory import check_chosen

    stack = load_stack("sim")
    hosts = select([], ["root@gpu1", "gpu1:22"], "s")
    with pytest.raises(InputError) as err:
        check_chosen(stack, hosts)
    assert str(err.value).startswith("--hosts: --hosts.1: host gpu1:22 is root@gpu1 again (address gpu1:22")


def test_a_second_live_rollout_of_the_stack_is_refused_naming_the_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #29: two identical rollouts at once; the second attached to the first as "(resumed)"."""
    from stackbuild.fleet.live import RolloutLive, live_marker_path, only_rollout

    ledger = tmp_path / "ledger.db"
    argv = ["deploy", "sim", "--fleet", "--hosts", "root@gpu1,root@gpu2", "--image", "r@sha256:" + "0" * 64,
            "--ledger", str(ledger)]
    with only_rollout(ledger, "sim") as live:
        live.name("r20261204-abcd")
        rc = main(argv)
        out, err = capsys.readouterr()
        assert (rc, out) == (4, "")
        assert err.startswith("stackbuild: another rollout of sim is live (rollout r20261204-abcd by pid "), err
        assert err.rstrip().endswith("a killed rollout is resumed by re-running its command)")
    from stackbuild.results.ledger import Ledger

    assert live_marker_path(ledger, "sim").exists()
    with Ledger(ledger) as db:
        assert db.rollouts() == []  # refused before a rollout was recorded (or a host reached)
    with only_rollout(ledger, "sim"):  # free again once the first ends, however it ended
        pass
    with only_rollout(ledger, "sim-other"), pytest.raises(RolloutLive, match="another rollout of sim-other is live"), \
            only_rollout(ledger, "sim-other"):
        pass


# --- an outage said before it happens (issue #29) -----------------------------------------


def test_waves_that_take_every_host_of_the_pool() -> None:
    from stackbuild.fleet.plan import emptying_waves

    assert emptying_waves(plan_waves(["h0"], ("100%",)), ["h0"]) == [0]  # a 1-host fleet's canary
    assert emptying_waves(plan_waves(["h0", "h1"], ("100%",)), ["h0", "h1"]) == []  # h0 serves during wave 1
    assert emptying_waves([["h0", "h1"]], ["h0", "h1"]) == [0]
    assert emptying_waves([], []) == []


def test_a_one_host_fleet_behind_the_gateway_is_an_outage_said_and_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = tmp_path / "ledger.db"
    base = ["deploy", "sim", "--fleet", "--hosts", "root@gpu1", "--image", "r@sha256:" + "0" * 64,
            "--ledger", str(ledger)]
    stack = load_stack("sim")
    bound = (stack.runtime.start_timeout_s + stack.runtime.ready_timeout_s
             + stack.gate.profiles[stack.gate.default_profile].gate_deadline_s())
    said = ("OUTAGE: the canary (root@gpu1) takes every host of the pool out of the gateway at once; the gateway has "
            "no server from the drain until the host is back: clients get errors for the whole deploy; the ledger "
            f"has no deploy of sim yet: at most {bound:g}s (runtime.start_timeout_s + ready_timeout_s + the gate's "
            "deadline)")
    assert main(base) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"stackbuild: {said}; refused without --allow-outage (or add hosts, or plan smaller "
                              "waves)\n")
    assert not ledger.exists()  # before the ledger, a build or a host
    # the dry run shows the plan with it, and refuses the same
    assert main([*base, "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith("fleet: plan: canary: root@gpu1; on_failure=halt")
    assert out.splitlines()[1] == f"fleet: {said}"
    assert err == f"stackbuild: {said}; refused without --allow-outage\n"
    assert main([*base, "--dry-run", "--allow-outage"]) == 0
    out, _ = capsys.readouterr()
    assert out.splitlines()[1:] == [f"fleet: {said}", "fleet: dry run: no image built, no host touched"]
    # two hosts: one serves while the other is out; nothing to say
    assert main([*base[:4], "root@gpu1,root@gpu2", *base[5:], "--dry-run"]) == 0
    assert "OUTAGE" not in capsys.readouterr().out
    assert main(["deploy", "sim", "--host", "root@gpu1", "--allow-outage"]) == 2
    assert "--allow-outage is for --fleet" in capsys.readouterr().err


def test_the_outage_estimate_is_the_ledger_s_deploys(tmp_path: Path) -> None:
    from stackbuild.results.ledger import DeployRecord
    from stackbuild.results.outage import deploy_seconds, pool_outage

    rec = DeployRecord(id=1, recorded_at="t", host="h", stack="sim", variant=None, config="c", image="i", digest=None,
                       strategy="side-by-side", outcome="promoted", crash_signature=None,
                       durations={"lock": 0.5, "start": 1.0, "ready": 3.0, "gate": 20.0, "take over": 1.5},
                       downtime_s=None, cause=None)
    assert deploy_seconds(rec) == 26.0
    from dataclasses import replace as dc_replace

    assert deploy_seconds(dc_replace(rec, outcome="rolled-back")) is None
    rt = load_stack("sim").runtime
    assert pool_outage(tmp_path / "none.db", load_stack("sim"), 60.0).endswith(
        f"at most {rt.start_timeout_s + rt.ready_timeout_s + 60:g}s (runtime.start_timeout_s + ready_timeout_s + "
        "the gate's deadline)")
