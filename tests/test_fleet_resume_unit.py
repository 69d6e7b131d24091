"""A fleet rollout SIGKILLed at each step of a host's deploy resumes (issue 23), on scripted FakeHosts.

The fleet is h0 (canary), h1, h2, each its own wave, each with the incumbent promoted. The kill
lands on h1's deploy (h0 already promoted by this rollout): before its host is marked (staged),
once its candidate started, mid-gate, mid-switch (side-by-side), once committed, and while its
wave soaks. The same command again must converge h1 (its lock, pending marker, candidate and
ports), keep the same rollout id, record h0 as promoted, and finish: every host on the candidate,
committed, enabled, booting it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers_deploy import CANDIDATE, INCUMBENT, PATHS, FakeGate, assert_boots_what_the_state_names, state
from helpers_fleet import Kill, fake_fleet, fleet_gateway, fleet_stack, revive, rollout

from stackbuild.gate.result import GateResult
from stackbuild.host import units
from stackbuild.host.state import other
from stackbuild.results.ledger import Ledger
from stackbuild.testing.fake_host import FakeHost, Killed
from stackbuild.testing.fake_server import Proc

Argv = list[str]
H1 = "root@h1"


def _on_h1(pred: Callable[[Argv], bool]) -> Kill:
    return lambda addr, args: addr == H1 and pred(args)


# step -> (kill before, kill after); "gating" kills from h1's gate
STEPS: dict[str, tuple[Kill | None, Kill | None]] = {
    "staged": (_on_h1(lambda a: a == ["<put>", PATHS.state_file, "0644"]), None),
    "candidate started": (None, _on_h1(lambda a: a[:2] == ["systemctl", "start"])),
    "gating": (None, None),
    # without a gateway the candidate is switched to the main unit; behind one it takes over where it runs:
    # killed once it joined the gateway and the incumbent stopped
    "switching": (None, _on_h1(lambda a: a == ["systemctl", "start", PATHS.switch_unit])),
    "taking over": (None, _on_h1(lambda a: a == ["systemctl", "stop", PATHS.main_unit])),
    "committed": (None, _on_h1(lambda a: a[:3] == ["sh", "-c", units.COMMIT_SCRIPT])),
    "soaking": (_on_h1(lambda a: a[:2] == ["systemctl", "show"] and "NRestarts" in a), None),  # a soak sample
}
STRATEGIES = {"swap": (True, ()), "side-by-side": (True, ("switching",)),
              "side-by-side, no gateway": (False, ("taking over",))}
CASES = [(s, st) for st, (_, skip) in STRATEGIES.items() for s in STEPS
         if s not in skip and not (st == "swap" and s in ("switching", "taking over"))]


def _killing_gate(host: FakeHost) -> Callable[..., GateResult]:
    def gate(*_a: object) -> GateResult:
        raise host.client.kill("killed mid-gate")

    return gate


def _ledger(tmp: Path) -> list[tuple[str, str, dict[str, str]]]:
    with Ledger(tmp / "ledger.db") as db:
        return [(r.id, r.outcome, {h.host: h.outcome for h in r.hosts}) for r in db.rollouts()]


@pytest.mark.parametrize(("step", "strategy"), CASES)
def test_a_rollout_killed_at_a_step_of_a_hosts_deploy_resumes_under_its_id(
        tmp_path: Path, step: str, strategy: str) -> None:
    fakes = fake_fleet()
    stack = fleet_stack(strategy.split(",")[0], soak_s=3.0, gateway=STRATEGIES[strategy][0])
    before, after = STEPS[step]
    gates = {"h1": _killing_gate(fakes["h1"])} if step == "gating" else None
    with pytest.raises(Killed):
        rollout(fakes, stack, tmp_path, gates, die_before=before, die_after=after)
    ((rid, outcome, rows),) = _ledger(tmp_path)
    assert (outcome, rows) == ("running", {"h0": "promoted"})  # what it knew when it died
    revive(fakes)
    h1 = state(fakes["h1"])
    committed = step in ("committed", "soaking")
    assert (h1.pending is not None) == (step not in ("staged", "committed", "soaking")), step
    assert h1.current is not None and h1.current.image == (CANDIDATE if committed else INCUMBENT)
    assert (PATHS.lease_dir in fakes["h1"].dirs) == (step != "soaking")  # the dead deploy's lock

    again = rollout(fakes, stack, tmp_path)
    out = "\n".join(again.out)
    assert again.code == 0, out
    assert f"fleet: rollout {rid} (resumed)" in out
    assert "fleet: already on the candidate, skipped: h0" in out
    ((rid2, outcome2, rows2),) = _ledger(tmp_path)  # one rollout, the same, completed
    assert (rid2, outcome2, rows2) == (rid, "completed", {"h0": "promoted", "h1": "promoted", "h2": "promoted"})
    (ops,) = again.ops
    # h1 converged before its preflight; deployed again unless it was promoted before the kill,
    # and then soaked with its wave all the same
    assert ops.calls.index(("converge", "h1")) < ops.calls.index(("preflight", "h1"))
    assert [h for what, h in ops.calls if what == "deploy"] == (["h2"] if committed else ["h1", "h2"])
    assert [h for what, h in ops.calls if what == "soak"] == ["h1", "h2"]
    if committed:
        assert "fleet: promoted before the interruption, soaked and decided with their wave: h1" in out
    for name, f in fakes.items():
        st = state(f)
        assert st.current is not None and st.current.image == CANDIDATE and st.pending is None, name
        assert PATHS.lease_dir not in f.dirs, name
        left = {*PATHS.files_of(other(st.slot)), *PATHS.switch_paths, *PATHS.files_of(st.slot)[:2]}
        assert not left & f.files.keys(), name
        assert_boots_what_the_state_names(f)


def test_a_killed_rollout_whose_orphaned_candidate_holds_the_staging_port_is_converged_before_preflight(
        tmp_path: Path) -> None:
    """The reported failure: a second run refused at preflight ("port ... is in use") by the candidate
    the first left running, twice, each time under a new rollout id."""
    fakes = fake_fleet()
    stack = fleet_stack("side-by-side")
    with pytest.raises(Killed):
        rollout(fakes, stack, tmp_path, die_after=STEPS["candidate started"][1])
    revive(fakes)
    fakes["h1"].sleep(5.0)
    assert fakes["h1"].serving(stack.runtime.staging_port) == CANDIDATE  # the orphan, on the staging port
    again = rollout(fakes, stack, tmp_path)
    assert again.code == 0, "\n".join(again.out)
    assert [(r[1], r[2]) for r in _ledger(tmp_path)] == [
        ("completed", {"h0": "promoted", "h1": "promoted", "h2": "promoted"})]
    # the orphan is gone: h1 serves its committed release on its port (behind the gateway, the staging
    # port, where the new candidate took over), and nothing on the other
    cur = state(fakes["h1"]).current
    assert cur is not None and cur.slot == "staging" and fakes["h1"].serving(cur.port) == CANDIDATE
    assert fakes["h1"].serving(stack.runtime.port) is None


def test_a_refused_rollout_is_resumed_under_its_id_and_keeps_what_it_recorded(tmp_path: Path) -> None:
    fakes = fake_fleet()
    stack = fleet_stack("swap")
    with pytest.raises(Killed):
        rollout(fakes, stack, tmp_path, die_before=STEPS["staged"][0])
    fakes["h2"].docker_version = None  # h2's daemon is down: the re-run is refused at preflight
    refused = rollout(fakes, stack, tmp_path)
    assert refused.code == 4
    ((rid, outcome, rows),) = _ledger(tmp_path)
    assert (outcome, rows["h0"], rows["h2"]) == ("refused", "promoted", "refused")  # h0 not "untouched"
    fakes["h2"].docker_version = "27.3.1"
    done = rollout(fakes, stack, tmp_path)
    assert done.code == 0 and [(r[0], r[1]) for r in _ledger(tmp_path)] == [(rid, "completed")]


# --- a take-over killed at each step never serves an ungated build (issue #29) ---------------------


def _proc_at(fakes: dict[str, FakeHost], url: str) -> Proc | None:
    """The process a gateway URL reaches (h0's own servers are 127.0.0.1 to the gateway on h0)."""
    name, port = url.removeprefix("http://").rsplit(":", 1)
    f = fakes["h0" if name == "127.0.0.1" else name]
    return next((p for p in tuple(f.running.values()) if p.port == int(port) and p.listening(f.now)), None)


@pytest.mark.parametrize("k", range(14))
def test_a_take_over_killed_at_each_step_then_rerun_sends_no_request_to_an_ungated_build(
        tmp_path: Path, k: int) -> None:
    """h1's deploy is SIGKILLed before its k-th command after its gate passed (the take-over: into the pool,
    the incumbent drained and stopped, the unit staged, the commit; then its soak), with a client sending
    through the gateway on every command of both runs. Every request lands on the incumbent's build or on
    a candidate's process after its own gate passed, and none fails between the first and last success."""
    fakes = fake_fleet()
    stack = fleet_stack("side-by-side", soak_s=3.0)
    gw = fleet_gateway(fakes)
    gated: set[str] = set()  # identities (--weight-version: the unit's start) whose gate passed
    bad: list[str] = []  # requests that reached a candidate process before its gate passed
    ok: list[bool] = []
    after_gate = {"on": False, "n": 0}

    def gate_of(name: str) -> Callable[..., GateResult]:
        inner = FakeGate(fakes[name])

        def gate(url: str, *a: object) -> GateResult:
            out = inner(url, *a)  # type: ignore[arg-type]
            proc = _proc_at({name: fakes[name], "h0": fakes["h0"]}, url.replace("127.0.0.1", name))
            if proc is not None and out.verdict in ("pass", "reference"):
                gated.add(proc.weight_version)
                after_gate["on"] = after_gate["on"] or name == "h1"
            return out

        return gate

    def client(addr: str, args: list[str]) -> bool:
        url = gw.send()
        ok.append(url is not None)
        if url is not None and (p := _proc_at(fakes, url)) is not None \
                and p.image == CANDIDATE and p.weight_version not in gated:
            bad.append(f"{url} ({p.weight_version}) before its gate, at {addr} {args[:3]}")
        return False

    def kill_k(addr: str, args: list[str]) -> bool:
        client(addr, args)
        if after_gate["on"] and addr in (H1, "root@h0"):
            after_gate["n"] += 1
            return after_gate["n"] == k + 1
        return False

    gates = {n: gate_of(n) for n in fakes}
    try:
        first = rollout(fakes, stack, tmp_path, gates, die_before=kill_k, gw=gw)
        assert first.code == 0, "\n".join(first.out)  # k past the end of the rollout: nothing to resume
    except Killed:
        revive(fakes)
        again = rollout(fakes, stack, tmp_path, gates, die_before=client, gw=gw)
        assert again.code == 0, "\n".join(again.out)
    assert bad == []
    served = ok[ok.index(True): len(ok) - ok[::-1].index(True)]
    assert served.count(False) == 0, gw.failures
    assert len(served) > 50
    for name, f in fakes.items():
        st = state(f)
        assert st.current is not None and st.current.image == CANDIDATE and st.pending is None, name
