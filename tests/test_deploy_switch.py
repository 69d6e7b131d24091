"""The side-by-side switch is one host-side transaction (issue 10, item 5), on the real host:
it promotes with the outage measured by a client, and a client killed during the switch
still leaves a server on the main port, the host having finished the transaction."""

from __future__ import annotations

import signal
import time

import pytest
from test_deploy_support import (
    Client,
    Project,
    deploy_host,  # noqa: F401  (fixture)
    project_fixture,
    record_figure,
    sim_image,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.integration


project = project_fixture("switch", deployed=True)


def test_side_by_side_promotes_through_one_transaction(project: Project) -> None:
    p = project
    with Client(p.port, kind="generate") as client:
        r = p.deploy("good2", "--strategy", "side-by-side")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "--seed 1" in p.unit_text() and p.serving()
    one_shot = f"stackbuild-switch-{p.service}.service"
    for d in ("/run/systemd/system", "/etc/systemd/system"):  # the candidate and the switch's oneshot: gone
        assert p.host.sh(f"ls {d}/{p.service}-candidate.service {d}/{one_shot}").stdout == ""
    assert p.host.sh(f"systemctl show -p LoadState {one_shot}").stdout.strip() == "LoadState=not-found"
    # the promoted release runs from its committed unit, enabled
    show = p.host.sh(f"systemctl show -p FragmentPath -p UnitFileState {p.service}").stdout.split()
    assert show == [f"FragmentPath=/etc/systemd/system/{p.service}.service", "UnitFileState=enabled"]
    record_figure(scenario="side-by-side switch", client_s=round(client.downtime(), 3),
                  failed_requests=client.failed, requests=len(client.results))


def test_client_killed_during_the_switch_leaves_a_server(project: Project) -> None:
    p = project
    proc = p.popen(None, "--strategy", "side-by-side")
    assert proc.stdout is not None
    for line in proc.stdout:
        if "deploy: switch ..." in line:
            break
    time.sleep(0.3)  # inside the transaction: candidate stopped, main being replaced
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (p.active() == "active" and p.serving()):
        time.sleep(0.2)
    assert p.active() == "active" and p.serving(), "nothing serves after the client died mid-switch"
