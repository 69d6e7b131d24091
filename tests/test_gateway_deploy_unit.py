"""One host behind the gateway (its unit on the same host), on the scripted FakeHost and the FakeGateway.

A client sends one request through the gateway on every command the host is sent; each runs
2 s on the server it lands on. Side-by-side: the candidate joins on the port it runs on, the
incumbent is drained and stopped, nothing restarts, and the host state records which unit and
port serve -- converge, status, rollback and a reboot follow it. Swap: drained, then the outage
the plan announced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest
from helpers_deploy import (
    CAND_UNIT,
    CANDIDATE,
    INCUMBENT,
    MAIN,
    PATHS,
    FakeGate,
    assert_boots_what_the_state_names,
    request,
    run,
    services,
    sim_stack,
    snapshot,
    state,
    steps,
    with_incumbent,
)
from helpers_fleet import GATEWAY_SPEC, GW_IMAGE, FakeReach, gateway_on, look
from test_converge_unit import conv

from stackbuild.effects.gateway import Unauthorized
from stackbuild.flows.deploy_host import DeployArgs, gateway_lines, run_deploy, run_rollback
from stackbuild.host import converge
from stackbuild.host.deploy import deploy
from stackbuild.host.dryrun import DryRunRemote
from stackbuild.host.gateway import GatewayRecord, edit_pool, ensure
from stackbuild.host.pool import GatewayLink
from stackbuild.host.ssh import SshOptions
from stackbuild.render.gateway import key_file, pool_file, pool_urls
from stackbuild.spec.stack import Stack
from stackbuild.testing.fake_gateway import FakeGateway
from stackbuild.testing.fake_host import SERVES, Client, FakeHost

PORT, STAGING = 31000, 31001
U_MAIN, U_STAGING = f"http://127.0.0.1:{PORT}", f"http://127.0.0.1:{STAGING}"
LEAD = [("lock", True), ("state", True), ("preflight", True), ("pull", True), ("gateway", True), ("stage unit", True),
        ("baseline", True), ("mark pending", True), ("secrets", True), ("start", True), ("ready", True),
        ("gate", True)]


def behind_gateway(host: FakeHost, stack: Stack | None = None, *, stuck: int | None = None,
                   ) -> tuple[FakeGateway, GatewayLink]:
    """The gateway on `host` in front of its server, and the link a deploy gets to it; a client sending
    one request through it on every command once it serves. `stuck`: a port whose /metrics always reads
    busy (a drain of it never ends)."""
    host.registry.add(GW_IMAGE)
    host.servers[GW_IMAGE] = SERVES
    gw = gateway_on(host, lambda _name: host)

    def send(_address: str, _argv: list[str]) -> bool:
        if gw.up():
            gw.send()
        return False

    host.client = Client(die_before=send)

    @contextmanager
    def watch(port: int) -> Iterator[Callable[[], float | None]]:
        yield (lambda: 5.0) if port == stuck else (lambda: gw.in_flight_of(f"http://127.0.0.1:{port}"))

    def unit(workers: list[str]) -> str:
        return ensure(host, stack or sim_stack(), GW_IMAGE, workers, pull_timeout_s=60.0)

    def pool_edit(add: list[str], remove: list[str]) -> None:
        edit_pool(host, GATEWAY_SPEC, add, remove)

    link = GatewayLink(gw, lambda port: f"http://127.0.0.1:{port}", watch, pool_edit,
                       {"main": PORT, "staging": STAGING}, drain_timeout_s=GATEWAY_SPEC.drain_timeout_s,
                       join_timeout_s=60.0, unit=unit)
    return gw, link


def pool(host: FakeHost, gw: FakeGateway) -> tuple[list[str], list[str]]:
    return (sorted(w.url for w in gw.workers() if w.routable),
            sorted(pool_urls(host.files.get(pool_file(GATEWAY_SPEC)))))


def test_side_by_side_through_the_gateway_commits_the_candidate_where_it_runs_and_drops_nothing() -> None:
    host = with_incumbent()
    gw, link = behind_gateway(host)
    rep = run(host, "side-by-side", gateway=link)
    assert (rep.outcome, rep.exit_code) == ("promoted", 0), rep.render()
    assert steps(rep) == [*LEAD, ("take over", True), ("promote", True)]
    assert rep.steps[-2].detail == (f"{U_STAGING} in the gateway; {U_MAIN} drained in 2.2s; stopped {MAIN}; "
                                    f"{CAND_UNIT} serves port {STAGING}: nothing restarted")
    cur = state(host).current
    assert cur is not None and (cur.image, cur.slot, cur.port) == (CANDIDATE, "staging", STAGING)
    # the candidate still runs the process the gate measured; the incumbent's unit is gone, not enabled
    started = host.running[CAND_UNIT].started_at
    assert set(host.running) == {CAND_UNIT, f"{GATEWAY_SPEC.service}.service"} and rep.downtime_s is None
    assert PATHS.main_path not in host.files and MAIN not in host.enabled
    assert host.files[PATHS.unit_path(CAND_UNIT)] == cur.unit and host.enabled[CAND_UNIT] == PATHS.unit_path(CAND_UNIT)
    assert pool(host, gw) == ([U_STAGING], [U_STAGING])
    # the next side-by-side goes the other way: into the main unit, on the main port
    rep2 = run(host, "side-by-side", image=INCUMBENT, gateway=link)
    assert (rep2.outcome, rep2.exit_code) == ("promoted", 0), rep2.render()
    cur2 = state(host).current
    assert cur2 is not None and (cur2.image, cur2.slot, cur2.port) == (INCUMBENT, "main", PORT)
    assert pool(host, gw) == ([U_MAIN], [U_MAIN]) and CAND_UNIT not in host.running
    assert started < host.running[MAIN].started_at
    assert (gw.failed, gw.failures) == (0, []) and gw.sent >= 50, gw.sent
    assert_boots_what_the_state_names(host)


def test_converge_status_and_rollback_follow_the_unit_that_serves() -> None:
    host = with_incumbent()
    gw, link = behind_gateway(host)
    assert run(host, "side-by-side", gateway=link).exit_code == 0
    started = host.running[CAND_UNIT].started_at
    c = conv(host)
    c.link = link
    converge.to_current(host, PATHS, state(host), c)  # nothing to do: the staging unit runs what is committed
    assert host.running[CAND_UNIT].started_at == started
    assert c.report.steps[0].detail == f"{CAND_UNIT} already runs {CANDIDATE}"
    st = converge.status(host, PATHS)
    assert (st.active, st.unit, st.running_image, st.enabled, st.under_test) == (
        True, CAND_UNIT, CANDIDATE, "enabled", False)
    assert f"  serves:   port {STAGING} ({CAND_UNIT})" in st.render(host.address).splitlines()
    # rolled back to the release before it, on the main unit: it serves and joins before the other leaves
    c = conv(host)
    c.link = link
    converge.rollback(host, PATHS, c)
    cur = state(host).current
    assert cur is not None and (cur.image, cur.slot, cur.port) == (INCUMBENT, "main", PORT)
    assert set(host.running) == {MAIN, f"{GATEWAY_SPEC.service}.service"}
    assert pool(host, gw) == ([U_MAIN], [U_MAIN])
    assert (gw.failed, gw.failures) == (0, [])
    assert_boots_what_the_state_names(host)


def test_a_side_by_side_candidate_that_fails_its_gate_never_joins() -> None:
    host = with_incumbent()
    gw, link = behind_gateway(host)
    rep = run(host, "side-by-side", gate=FakeGate(host, verdicts={CANDIDATE: "fail"}), gateway=link)
    assert (rep.outcome, rep.exit_code) == ("rolled-back", 1)
    # in from the bring-up on, the incumbent stays; the restore makes sure of it, then the candidate goes
    # (the candidate's port is taken out before it starts there: no stale entry routes to it)
    assert gw.calls == [f"add {U_MAIN}", f"remove {U_STAGING}", f"add {U_MAIN}", f"remove {U_STAGING}"]
    assert pool(host, gw) == ([U_MAIN], [U_MAIN]) and host.serving(PORT) == INCUMBENT
    assert (gw.failed, gw.failures) == (0, [])


def test_an_incumbent_that_will_not_empty_stays_and_the_candidate_that_joined_leaves_exit_4() -> None:
    host = with_incumbent()
    gw, link = behind_gateway(host, stuck=PORT)
    rep = run(host, "side-by-side", gateway=link)
    assert (rep.outcome, rep.exit_code) == ("rolled-back", 4), rep.render()
    assert rep.cause is not None and f"drain of {U_MAIN} from the gateway" in rep.cause
    assert gw.calls == [f"add {U_MAIN}", f"remove {U_STAGING}", f"add {U_STAGING}", f"remove {U_MAIN}",
                        f"add {U_MAIN}",  # back in
                        f"add {U_MAIN}", f"remove {U_STAGING}"]  # the restore: the incumbent stays, the candidate goes
    assert pool(host, gw) == ([U_MAIN], [U_MAIN]) and host.serving(PORT) == INCUMBENT
    assert state(host).current.image == INCUMBENT and CAND_UNIT not in host.running  # type: ignore[union-attr]
    assert (gw.failed, gw.failures) == (0, [])
    assert_boots_what_the_state_names(host)


def test_a_swap_behind_the_gateway_drains_first_and_says_its_outage_before_it() -> None:
    host = with_incumbent()
    gw, link = behind_gateway(host)
    said = "swap: ... about 2.0s (the median of 3 load(s) of sim in the ledger, the longest 2.4s)"
    rep = run(host, "swap", gateway=link, outage_plan=lambda: said)
    assert (rep.outcome, rep.exit_code) == ("promoted", 0), rep.render()
    names = [s.name for s in rep.steps]
    assert names.index("outage plan") < names.index("start") and rep.steps[names.index("outage plan")].detail == said
    assert rep.steps[names.index("start")].detail == f"{U_MAIN} drained in 2.2s; {MAIN} on port {PORT}"
    assert gw.calls == [f"add {U_MAIN}", f"remove {U_MAIN}", f"add {U_MAIN}"]
    # one host: while it swaps, nothing is in the pool -- the outage the plan announced, nothing else
    assert gw.failed > 0 and set(gw.failures) == {"no worker to route to"}
    assert rep.downtime_s == 2.0


def test_a_dry_run_says_the_gateway_steps_and_the_swap_outage() -> None:
    host = with_incumbent()
    _, link = behind_gateway(host)
    lines: list[str] = []
    dry = DryRunRemote(host.address, reader=host, echo=lines.append)
    rep = deploy(dry, request("swap"), services(host, gateway=link, outage_plan=lambda: "swap: the outage",
                                                echo=lines.append))
    assert rep.outcome == "planned"
    plan = [ln for ln in lines if not ln.startswith(("would run", "read", "would put"))]
    assert plan[:4] == ["would mark the deploy pending in /var/lib/stackbuild/stackbuild-sim/state.json",
                        f"would drain {U_MAIN} out of the gateway {gw_url()}", f"would stop the incumbent {MAIN}",
                        "swap: the outage"]
    lines.clear()
    deploy(DryRunRemote(host.address, reader=host, echo=lines.append), request("side-by-side"),
           services(host, gateway=link, echo=lines.append))
    assert (f"would add {U_STAGING} to the gateway {gw_url()}, drain {U_MAIN} and stop {MAIN}: nothing restarts, "
            f"port {STAGING} serves from then on") in lines


def gw_url() -> str:
    return f"http://127.0.0.1:{GATEWAY_SPEC.port}"


def test_deploy_dry_run_of_a_swap_behind_the_gateway_plans_the_drain_and_the_ledgers_outage(tmp_path: Path) -> None:
    """`stackbuild deploy STACK --host H --strategy swap --dry-run` (run_deploy, as the CLI calls it)."""
    host = with_incumbent()
    host.registry.add(GW_IMAGE)
    host.servers[GW_IMAGE] = SERVES
    lines: list[str] = []
    reach = FakeReach({"127.0.0.1": host}, gw=gateway_on(host, lambda _: host))
    args = DeployArgs(stack=sim_stack(), ssh=SshOptions(), host_text="root@127.0.0.1", strategy="swap",
                      image=CANDIDATE, gateway_image=GW_IMAGE, ledger=tmp_path / "ledger.db", root=tmp_path,
                      tunnel=False, dry_run=True, reach=reach)
    before = snapshot(host)
    assert run_deploy(args, echo=lines.append) == 0
    assert snapshot(host) == before  # a plan: nothing changed
    plan = [ln for ln in lines if ln.startswith(("would drain", "would stop", "swap:", "would add"))]
    assert plan == [f"would drain {U_MAIN} out of the gateway {gw_url()}", f"would stop the incumbent {MAIN}",
                    "swap: the incumbent stops before the candidate starts, so clients get no answer until it "
                    "serves; the ledger has no load time of sim yet: the outage lasts as long as the candidate "
                    "takes to load, at most 120s (runtime.start_timeout_s + ready_timeout_s)"]
    # the gateway's unit: what would be done to it is printed, not done (its pool file seeded, say)
    said = ("\n".join(lines)).split("\nwould ")  # a command whose argv holds newlines spans lines
    assert any(cmd.startswith("run: ") and pool_file(GATEWAY_SPEC) in cmd for cmd in said)


def test_rollback_with_the_stack_drains_through_its_gateway() -> None:
    """`stackbuild rollback --host H --stack STACK`: back to the release before, behind the stack's gateway."""
    host = with_incumbent()
    gw, link = behind_gateway(host)
    assert run(host, "side-by-side", gateway=link).exit_code == 0  # serves from the staging unit now
    reach = FakeReach({"127.0.0.1": host}, gw=gw)
    rep = run_rollback("root@127.0.0.1", SshOptions(), service=None, state_dir=PATHS.state_dir, timeout_s=60.0,
                       tunnel=False, dry_run=False, echo=lambda _: None, reach=reach, stack=sim_stack())
    assert (rep.outcome, rep.exit_code) == ("rolled-back", 0)
    assert [s.name for s in rep.steps] == ["restore", "verify serving", "gateway"]
    # back in before the other unit leaves: the pool is never empty
    assert rep.steps[-1].detail == (f"{U_MAIN} in the gateway; "
                                    f"{U_STAGING} drained (out of the gateway, nothing in flight)")
    cur = look(host).current
    assert cur is not None and (cur.image, cur.slot) == (INCUMBENT, "main") and CAND_UNIT not in host.running
    assert pool(host, gw) == ([U_MAIN], [U_MAIN])
    assert (gw.failed, gw.failures) == (0, [])


ROGUE = "http://10.9.9.9:8000"


def test_deploy_makes_the_control_plane_key_on_the_gateway_host_uses_it_and_says_it_nowhere(tmp_path: Path) -> None:
    host = with_incumbent()
    host.registry.add(GW_IMAGE)
    host.servers[GW_IMAGE] = SERVES
    gw = gateway_on(host, lambda _: host)
    lines: list[str] = []
    stack = sim_stack()
    stack = stack.model_copy(update={"host": stack.host.model_copy(update={"channel": None})})  # no registry here
    args = DeployArgs(stack=stack, ssh=SshOptions(), host_text="root@127.0.0.1", strategy="side-by-side",
                      image=CANDIDATE, gateway_image=GW_IMAGE, ledger=tmp_path / "ledger.db", root=tmp_path,
                      tunnel=False, reach=FakeReach({"127.0.0.1": host}, gw=gw))
    assert run_deploy(args, echo=lines.append) == 0, "\n".join(lines)
    key = "fake-key-1-" + host.address
    # made on the host, once, 0600; the gateway started with it and took every call stackbuild made
    assert (host.files[key_file(GATEWAY_SPEC)], host.modes[key_file(GATEWAY_SPEC)], host.keys_made) == (
        f"SMG_CONTROL_PLANE_KEY={key}\n", 0o600, 1)
    assert (gw.key, gw.refusals) == (key, 0) and pool(host, gw) == ([U_STAGING], [U_STAGING])
    assert run_deploy(args, echo=lines.append) == 0 and host.keys_made == 1  # the next deploy reuses it
    # nowhere else: not in the output, the step logs, the ledger, the unit, the pool file, any other host file
    logs = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    assert logs and not [b for b in logs if key.encode() in b]
    assert key not in "\n".join(lines)
    assert [p for p, text in host.files.items() if key in text] == [key_file(GATEWAY_SPEC)]
    # an open caller -- anyone on the network -- is refused
    with pytest.raises(Unauthorized):
        gw.client(None).add(ROGUE, timeout_s=5)
    assert gw.refusals == 1 and ROGUE not in [w.url for w in gw.workers()]


def test_a_worker_stackbuild_did_not_put_in_the_gateway_is_named_and_pruned_on_request() -> None:
    host = with_incumbent()
    gw, link = behind_gateway(host)
    link.read_pool = lambda: pool_urls(host.files.get(pool_file(GATEWAY_SPEC)))
    link.bring_up(PORT)
    gw.start(ROGUE)  # someone with the key (or a gateway of old, open) added it
    said = link.bring_up(PORT)
    assert said.endswith(f"; WARNING: the gateway routes to 1 worker(s) stackbuild did not put there: {ROGUE}; "
                         "`deploy --prune-workers` removes them")
    assert sorted(w.url for w in gw.workers()) == sorted([U_MAIN, ROGUE])  # named only
    link.prune = True
    said = link.bring_up(PORT)
    assert said.endswith(f"; removed 1 worker(s) stackbuild did not put there (--prune-workers): {ROGUE}")
    assert pool(host, gw) == ([U_MAIN], [U_MAIN]) and gw.calls[-1] == f"remove {ROGUE}"
    assert link.bring_up(PORT).endswith(f"{U_MAIN} in the gateway")  # nothing odd left: nothing said


def test_status_names_a_worker_stackbuild_did_not_put_there(tmp_path: Path) -> None:
    host = with_incumbent()
    gw, link = behind_gateway(host)
    link.bring_up(PORT)
    gw.start(ROGUE)
    rec = GatewayRecord(service=GATEWAY_SPEC.service, image=GW_IMAGE, port=GATEWAY_SPEC.port, stack="sim", at="now")
    lines = gateway_lines(FakeReach({"127.0.0.1": host}, gw=gw), host, lambda port: nullcontext(gw_url()), rec)
    assert lines[1:] == [
        f"    {U_MAIN}: ready, 2 in flight",  # the test client's requests
        f"    {ROGUE}: ready, 0 in flight, NOT put there by stackbuild (not in its pool file; "
        "`deploy --prune-workers` removes it)",
        "  WARNING: 1 worker(s) in the gateway that stackbuild did not put there"]


def test_a_gateway_stopped_during_the_gate_leaves_no_rejected_candidate_running() -> None:
    host = with_incumbent()
    _, link = behind_gateway(host)
    inner = FakeGate(host, verdicts={CANDIDATE: "fail"})
    gateway_unit = f"{GATEWAY_SPEC.service}.service"

    def gate(url: str, *a: object) -> object:
        host.running.pop(gateway_unit)  # `systemctl stop` of the gateway while the candidate is measured
        return inner(url, *a)

    rep = run(host, "side-by-side", gate=gate, gateway=link)
    assert (rep.outcome, rep.exit_code) == ("rolled-back", 1), rep.render()
    last = rep.steps[-1]
    assert (last.name, last.ok) == ("gateway", False)
    assert last.detail.startswith("sha256:111111111111 serves again but is NOT back in the gateway (GET "
                                  "http://127.0.0.1:31080/workers: no answer (ConnectionRefusedError: refused)); "
                                  "the next deploy puts it back; ")
    assert "FAIL gateway" in rep.render(full=False)
    assert CAND_UNIT not in host.running and host.serving(STAGING) is None  # the rejected build is gone
    assert host.serving(PORT) == INCUMBENT and state(host).current.image == INCUMBENT  # type: ignore[union-attr]
