"""A stalled candidate cannot hold production (issue 10, item 2), on the real host under swap:
the gate's stall timeout ends it with the incumbent back, and SIGTERM mid-gate restores the
incumbent before the command exits. Both report the incumbent's downtime."""

from __future__ import annotations

import signal

import pytest
from test_deploy_support import (
    Project,
    deploy_host,  # noqa: F401  (fixture)
    project_fixture,
    record_figure,
    reported_downtime,
    sim_image,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.integration
VARIANTS = (
    "  stall: {server: {flags: {--fault: stall-stream}}, gate: {profiles: {tiny: {stall_timeout_s: 1}}}}\n"
    "  stallhang: {server: {flags: {--fault: stall-stream}}, gate: {profiles: {tiny: {stall_timeout_s: 600,"
    " timeout_s: 600}}}}\n"
)


project = project_fixture("stall", VARIANTS, deployed=True)


def _restored(p: Project, before: object) -> None:
    st = p.state()
    assert st["current"] == before and st.get("pending") is None
    assert p.active() == "active" and p.serving()
    assert p.host.sh(f"test -d /var/lib/stackbuild/{p.service}/lock").returncode != 0


def test_sigterm_mid_gate_restores_the_incumbent(project: Project) -> None:
    p = project
    before = p.state()["current"]
    proc = p.popen("stallhang", "--strategy", "swap")
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # the gate's start, told as it happens
        seen.append(line)
        if line.rstrip().endswith("] gate"):  # the plain line of the gate stage starting
            break
    else:
        pytest.fail("".join(seen))
    proc.send_signal(signal.SIGTERM)  # the gate has begun: the host is disturbed, the handler armed
    rest, _ = proc.communicate(timeout=120)
    out = "".join(seen) + rest
    assert proc.returncode == 4, out
    assert "interrupted by SIGTERM" in out and "outcome: rolled-back" in out
    assert "Traceback" not in out, out
    _restored(p, before)
    record_figure(scenario="swap SIGTERM mid-gate", reported_s=reported_downtime(out))
