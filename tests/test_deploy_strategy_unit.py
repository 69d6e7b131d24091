"""Deploy strategies are modules behind one protocol (host/strategy.py), listed by name in
spec/stack.py's STRATEGY_MODULES: each entry is a module of stackbuild.host.strategies that implements
it, what a spec's strategy becomes once the candidate is placed is exact, and a new strategy is one
module plus one registry line -- a trivial one runs through the real deploy flow on the fake host.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import cast, get_args

import pytest
from helpers_deploy import (
    CANDIDATE,
    MAIN,
    PATHS,
    PORT,
    FakeGate,
    request,
    run,
    services,
    state,
    steps,
    with_incumbent,
)

from stackbuild.errors import InputError
from stackbuild.host import units
from stackbuild.host.deploy import deploy
from stackbuild.host.deploy_steps import Placement
from stackbuild.host.dryrun import DryRunRemote
from stackbuild.host.pool import GatewayLink
from stackbuild.host.ssh import sh_argv
from stackbuild.host.strategy import Candidate, Served, Strategy, strategy_named
from stackbuild.spec.stack import STRATEGY_MODULES, Host

GOOD = [("lock", True), ("state", True), ("preflight", True), ("pull", True), ("stage unit", True),
        ("baseline", True), ("mark pending", True), ("secrets", True)]


def test_the_registry_names_the_three_strategies_each_a_module_of_host_strategies() -> None:
    assert STRATEGY_MODULES == {
        "swap": "stackbuild.host.strategies.swap",
        "side-by-side": "stackbuild.host.strategies.side_by_side",
        "take-over": "stackbuild.host.strategies.take_over",
    }
    for name, path in STRATEGY_MODULES.items():
        module = importlib.import_module(path)
        assert path.startswith("stackbuild.host.strategies.")
        assert isinstance(module, Strategy), path
        assert strategy_named(name) is module
        assert (name, name == "swap") == (module.NAME, module.IN_PLACE)


def test_every_strategy_a_spec_may_name_is_in_the_registry() -> None:
    named = get_args(Host.model_fields["strategy"].annotation)
    assert set(named) == {"swap", "side-by-side"} <= set(STRATEGY_MODULES)


def test_an_unknown_strategy_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(InputError, match=r"^unknown deploy strategy 'blue-green' \(known: side-by-side, swap, "
                                         r"take-over\)$"):
        strategy_named("blue-green")


GW = cast(GatewayLink, object())  # runs_as asks only whether there is a gateway


@pytest.mark.parametrize(("requested", "p", "gateway", "runs"), [
    ("swap", Placement("main", 30000, "main", 30000), None, "swap"),
    ("swap", Placement("main", 30000, "main", 30000), GW, "swap"),
    # a first deploy has nothing to run beside: in place
    ("side-by-side", Placement("main", 30000, "main", 30000), None, "swap"),
    ("side-by-side", Placement("staging", 30001, "main", 30000), None, "side-by-side"),
    # behind a gateway, or back on the main unit: the candidate keeps its unit
    ("side-by-side", Placement("staging", 30001, "main", 30000), GW, "take-over"),
    ("side-by-side", Placement("main", 30000, "staging", 30001), None, "take-over"),
    ("take-over", Placement("staging", 30001, "main", 30000), GW, "take-over"),
])
def test_what_a_strategy_runs_as_once_its_candidate_is_placed(requested: str, p: Placement,
                                                                gateway: GatewayLink | None, runs: str) -> None:
    assert strategy_named(requested).runs_as(p, gateway) == runs


def _stop_first() -> ModuleType:
    """StopFirst: a swap whose incumbent stops in a step of its own before the start step, and whose
    hand-over says so in one more step: the whole strategy, as a module implementing the protocol."""
    mod = ModuleType("stop_first")

    def runs_as(p: Placement, gateway: GatewayLink | None) -> str:
        return "stop-first"

    def plan_start(c: Candidate) -> None:
        c.svc.echo(f"would stop {c.unit} first")

    def start(c: Candidate) -> str:
        with c.rep.step("stop first") as st:  # inside the flow's start step: it ends first
            if c.incumbent_active:
                c.conv.outage_begin()  # ends once the candidate is ready (the flow's readiness)
                units.stop(c.remote, c.unit)
            st.detail = f"stopped {c.unit}"
        return "stopped first; "

    def hand_over(c: Candidate) -> Served:
        with c.rep.step("stop first: hand over") as st:
            st.detail = f"{c.unit} serves where it started"
        return Served(c.p.slot, c.p.port, c.paths.runs_from(c.p.slot, serving=True),
                      f"{c.paths.staging_dir}/{c.unit}", c.text, rejoin=True)

    def plan_hand_over(c: Candidate) -> None:
        c.svc.echo("would hand over in place")

    vars(mod).update(NAME="stop-first", IN_PLACE=True, runs_as=runs_as, plan_start=plan_start, start=start,
                     hand_over=hand_over, plan_hand_over=plan_hand_over)
    return mod


def test_a_new_strategy_is_one_module_and_one_registry_line(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _stop_first()
    assert isinstance(mod, Strategy)
    monkeypatch.setitem(sys.modules, "stop_first", mod)
    monkeypatch.setitem(STRATEGY_MODULES, "stop-first", "stop_first")
    host = with_incumbent()
    rep = run(host, "stop-first", gate=FakeGate(host))

    assert (rep.outcome, rep.exit_code, rep.verdict, rep.strategy) == ("promoted", 0, "pass", "stop-first")
    assert steps(rep) == [*GOOD, ("stop first", True), ("start", True), ("ready", True), ("gate", True),
                          ("stop first: hand over", True), ("promote", True)]
    assert [(s.name, s.detail) for s in rep.steps if s.name in ("stop first", "start", "stop first: hand over")] == [
        ("stop first", f"stopped {MAIN}"),
        ("start", f"stopped first; {MAIN} on port {PORT}"),
        ("stop first: hand over", f"{MAIN} serves where it started"),
    ]
    start = host.commands.index(["date", "+%s"])
    assert host.commands[start:start + 5] == [
        ["date", "+%s"], ["systemctl", "stop", MAIN],
        sh_argv(units.INSTALL_SCRIPT, f"{PATHS.staging_dir}/{MAIN}", PATHS.override_path),
        ["systemctl", "reset-failed", MAIN], ["systemctl", "start", MAIN],
    ]
    assert rep.downtime_s == 2.0  # stopped, then the candidate listens 2 s after its start
    current = state(host).current
    assert current is not None and (current.image, current.slot, current.port) == (CANDIDATE, "main", PORT)
    assert host.running[MAIN].image == CANDIDATE and PATHS.lease_dir not in host.dirs


def test_a_new_strategy_plans_its_own_steps_in_a_dry_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "stop_first", _stop_first())
    monkeypatch.setitem(STRATEGY_MODULES, "stop-first", "stop_first")
    host = with_incumbent()
    said: list[str] = []
    rep = deploy(DryRunRemote(host.address, reader=host, echo=said.append), request("stop-first"),
                 services(host, echo=said.append))
    assert (rep.outcome, rep.exit_code) == ("planned", 0)
    assert said[said.index(f"would mark the deploy pending in {PATHS.state_file}") + 1] == f"would stop {MAIN} first"
    handed = said.index("would hand over in place")
    assert said[handed + 1] == f"would promote (write {PATHS.state_file}) or roll back to the incumbent"
    assert said.index(f"would run: systemctl start {MAIN}") < handed
