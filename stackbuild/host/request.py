"""What a deploy is asked to do (`DeployRequest`) and the effects beyond SSH it is handed (`Services`).

Apart from the flow (deploy.py) so the pieces that judge a deploy (decide.py) can name
these types without importing the flow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from stackbuild.effects.readiness import HttpProbe, Pace, Probe
from stackbuild.gate.result import GateResult
from stackbuild.host.pool import GatewayLink
from stackbuild.host.state import LEASE_TTL_S, new_run
from stackbuild.results.display import Sink
from stackbuild.spec.profile import GateProfile
from stackbuild.spec.stack import Stack


@dataclass(frozen=True)
class LiveIncumbent:
    """The serving incumbent as the gate's baseline: measured in alternation with the candidate
    (ABBA, `gate --baseline-url`), at `url` as this process reaches it."""

    url: str
    name: str


# (candidate url, profile, candidate name, baseline: a stored result, the live incumbent, or none)
GateFn = Callable[[str, GateProfile, str, GateResult | LiveIncumbent | None], GateResult]


@dataclass
class DeployRequest:
    stack: Stack
    image: str  # pinned: REPO@sha256:...
    digest: str
    strategy: str
    profile: GateProfile
    secrets: dict[str, str] = field(default_factory=dict)
    pull_timeout_s: float = 1800.0
    lease_ttl_s: float = LEASE_TTL_S
    run: str = field(default_factory=new_run)  # who owns the host lease: this deploy (and its recovery)


@dataclass
class Services:
    """The effects beyond SSH, passed in so the flow stays one readable function."""

    render_unit: Callable[..., str]
    gate: GateFn
    # base URL reaching the host's 127.0.0.1:PORT (direct on loopback, else an SSH tunnel)
    endpoint: Callable[[int], AbstractContextManager[str]]
    # the server's HTTP layers at a base URL (a fake in unit tests), and how often to poll them
    http_probe: Callable[[str], Probe] = HttpProbe
    pace: Pace = field(default_factory=Pace)
    promote_channel: Callable[[str], str] | None = None  # digest ref -> what moved
    # how the gate reaches the server ("direct" | "tunnel"): results measured one
    # way are not a baseline for the other (the tunnel costs throughput)
    access: str = "direct"
    echo: Callable[[str], None] = print
    progress: Sink | None = None  # each step as it starts and ends (results/display.py)
    sleep: Callable[[float], None] = time.sleep
    # the gate's plan (expected runs and duration) for a dry run to print
    gate_plan: Callable[[GateProfile, bool], str] | None = None
    # the gateway in front of the host (None: clients reach the server's port directly): brought up
    # to date first, then servers are drained out of it before they stop and join it once they
    # serve (host/pool.py)
    gateway: GatewayLink | None = None
    # how long a swap's outage will be, from the ledger's load times for the stack (words)
    outage_plan: Callable[[], str] | None = None
