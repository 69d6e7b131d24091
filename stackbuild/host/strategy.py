"""How a deploy brings its candidate in: one small protocol, one module per strategy (pre-commit's languages).

A strategy is a module of host/strategies/ that implements `Strategy` with module-level names, listed
by name in spec/stack.py's STRATEGY_MODULES and loaded by `strategy_named`. deploy.py calls it only
where strategies differ: where the candidate runs (`IN_PLACE`), which strategy really runs once it is
placed (`runs_as`: a side-by-side with nothing beside it is a swap, and one that can keep its own unit
takes over), what makes room before the candidate starts (`start`), and how a candidate that passed
its gate comes to serve (`hand_over`); a dry run says both (`plan_start`, `plan_hand_over`).
Preflight, pull, staging, readiness, the gate, the promotion and every rollback are the same for all.

A new strategy: its module, one line in STRATEGY_MODULES, and any new host command it sends in
testing/fake_host.py (the unit tests run every strategy on the fake).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol, cast, runtime_checkable

from stackbuild.errors import InputError
from stackbuild.host import converge
from stackbuild.host.deploy_steps import Placement
from stackbuild.host.outcome import DeployReport
from stackbuild.host.pool import GatewayLink
from stackbuild.host.request import DeployRequest, Services
from stackbuild.host.ssh import Remote
from stackbuild.host.state import HostPaths, HostState, Slot, now_iso, write_state
from stackbuild.spec.stack import STRATEGY_MODULES


@dataclass
class Candidate:
    """One deploy's candidate as a strategy sees it: the host, where the candidate runs, its staged unit
    (`staged`, whose text is `text`), whether the incumbent serves, and the converger that puts it back."""

    remote: Remote
    req: DeployRequest
    svc: Services
    paths: HostPaths
    rep: DeployReport
    state: HostState
    conv: converge.Converger
    p: Placement
    staged: str
    text: str
    incumbent_active: bool

    @property
    def unit(self) -> str:
        """The candidate's unit file name."""
        return self.paths.unit_of(self.p.slot)

    def roll_back(self, cause: str, *, verdict: str) -> None:
        """Put the incumbent back (converge to the committed state), record why, finish rolled back."""
        rep = self.rep
        rep.verdict = rep.verdict or verdict
        restored = converge.to_current(self.remote, self.paths, self.state, self.conv)
        update = {"last_verdict": rep.verdict, "last_cause": cause[:500], "last_image": rep.image, "last_at": now_iso()}
        write_state(self.remote, self.paths, restored.model_copy(update=update))
        rep.finish("rolled-back", cause)


@dataclass(frozen=True)
class Served:
    """Where a promoted candidate serves from: the slot and port the release records, the path its unit
    runs from and the staged unit committed there (with its text), and whether it goes back into the
    gateway after the commit (it left the pool to be replaced) or is in it already."""

    slot: Slot
    port: int
    ran_from: str
    staged: str
    text: str
    rejoin: bool


@runtime_checkable
class Strategy(Protocol):
    """A module of host/strategies/ (module-level names), listed in STRATEGY_MODULES."""

    NAME: str  # its name in STRATEGY_MODULES
    IN_PLACE: bool  # runs in the incumbent's unit on its port (the incumbent stops first), else beside it

    def runs_as(self, p: Placement, gateway: GatewayLink | None) -> str:
        """The name of the strategy that runs a candidate placed at `p`: its own, or another's."""
        ...

    def plan_start(self, c: Candidate) -> None:
        """A dry run: say (svc.echo) what `start` would do."""
        ...

    def start(self, c: Candidate) -> str:
        """Inside the "start" step, before the candidate's unit starts: make room for it. Returns what it
        did, the start of the step's detail ("" or ending in "; ")."""
        ...

    def hand_over(self, c: Candidate) -> Served | None:
        """After a passing gate, before the promotion: make the candidate the one that serves (its own
        steps). None when that failed and `c.roll_back` put the incumbent back."""
        ...

    def plan_hand_over(self, c: Candidate) -> None:
        """A dry run: say what `hand_over` would do."""
        ...


def strategy_named(name: str) -> Strategy:
    """The strategy module listed under `name` in STRATEGY_MODULES."""
    try:
        path = STRATEGY_MODULES[name]
    except KeyError:
        raise InputError(f"unknown deploy strategy {name!r} (known: {', '.join(sorted(STRATEGY_MODULES))})") from None
    return cast(Strategy, importlib.import_module(path))

