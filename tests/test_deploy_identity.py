"""Nothing is measured or promoted unless it is provably the candidate (issue #29), on a real
systemd+sshd host: a port clash is refused before the host is touched, and a candidate that dies
on a port something already answers on is a start failure, whatever answered there."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_deploy_support import (
    Client,
    Project,
    assert_incumbent_unchanged,
    deploy_host,  # noqa: F401  (fixture)
    ensure_incumbent,
    project_fixture,
    sim_image,  # noqa: F401  (fixture)
)

from stackbuild.flows.deploy_host import DeployArgs, run_deploy
from stackbuild.host.outcome import DeployReport
from stackbuild.host.ssh import SshOptions
from stackbuild.spec.load import load_stack

pytestmark = pytest.mark.integration


project = project_fixture("identityproj")


def test_a_staging_port_on_the_port_is_refused_before_the_host_is_touched(project: Project) -> None:
    p = project
    ensure_incumbent(p)
    before = p.snapshot()
    spec = p.root / "stacks" / "simtest.yaml"
    good = spec.read_text()
    try:
        spec.write_text(good.replace(f"staging_port: {p.staging}", f"staging_port: {p.port}"))
        r = p.deploy(None, "--strategy", "side-by-side")
        v = subprocess.run([sys.executable, "-m", "stackbuild", "--root", str(p.root), "validate", "simtest",
                            "--offline"], capture_output=True, text=True, timeout=120)
    finally:
        spec.write_text(good)
    assert r.returncode == 2, r.stdout + r.stderr
    assert (f"simtest.yaml:18:17: error: runtime.staging_port: staging_port {p.port} is runtime.port too; the "
            "candidate must bind a port the incumbent does not hold") in r.stderr
    assert p.snapshot() == before  # no lock, no state, no unit: the host was not touched
    assert v.returncode == 2 and "runtime.staging_port: staging_port" in v.stderr, v.stdout + v.stderr


def test_a_candidate_dying_on_a_port_that_answers_is_a_start_failure(project: Project) -> None:
    """The reproduced case, in-process past the spec's check (a stack loaded before `validate`
    refused it): side-by-side with staging_port == port. The candidate's server dies with
    EADDRINUSE while the incumbent answers on the port: it is never gated nor promoted."""
    p = project
    before = ensure_incumbent(p)
    stack = load_stack("simtest", root=p.root)
    clash = stack.model_copy(update={"runtime": stack.runtime.model_copy(update={"staging_port": p.port})})
    args = DeployArgs(stack=clash, host_text=p.host.target, strategy="side-by-side", image=p.image.ref,
                      ledger=p.ledger, root=p.root,
                      ssh=SshOptions(known_hosts=p.host.known_hosts, key_filename=str(p.host.key)))
    reports: list[DeployReport] = []
    lines: list[str] = []
    with Client(p.port, kind="generate") as client:
        rc = run_deploy(args, echo=lines.append, reports=reports)
    rep = reports[0]
    out = "\n".join(lines)
    assert (rc, rep.outcome, rep.verdict) == (1, "rolled-back", "not-ready"), out
    assert rep.cause is not None
    # either the poll saw the process gone first, or the server on the port proved to be another one
    assert rep.cause.startswith(("candidate crashed on start", "candidate is not what answers on its port")), out
    assert "gate" not in [s.name for s in rep.steps]  # nothing was measured
    assert p.state()["last_verdict"] == "not-ready"
    assert_incumbent_unchanged(p, before)
    assert client.failed == 0 and len(client.results) > 3
