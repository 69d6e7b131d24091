"""`stackbuild deploy --host` against a real systemd+sshd host container and the registry.

One host and one sim image per session; each scenario is a real CLI run that
ends with the incumbent serving, the right exit code and a report naming the
cause. Swap downtime is measured by a client and printed.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from test_deploy_support import (
    Client,
    Project,
    assert_incumbent_unchanged,
    deploy_host,  # noqa: F401  (fixture)
    ensure_incumbent,
    free_port,
    project_fixture,
    record_figure,
    reported_downtime,
    sim_image,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.integration


project = project_fixture("deployproj")


def test_first_deploy_promotes_then_status(project: Project) -> None:
    p = project
    r = p.deploy()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "outcome: promoted (exit 0)" in r.stdout
    st = p.state()
    cur = st["current"]
    assert isinstance(cur, dict) and cur["digest"] == p.image.digest
    assert p.serving()
    # the registry channel moved to the promoted digest, and the ledger has the deploy
    from stackbuild.image.registry import Ref, manifest_digest
    from stackbuild.results.ledger import Ledger

    repo = p.image.ref.split("@")[0].split("/", 1)[1]
    assert manifest_digest(Ref("127.0.0.1:5000", repo, p.service)) == p.image.digest
    with Ledger(p.ledger) as ledger:
        last = ledger.deploys()[-1]
    assert (last.outcome, last.digest, last.strategy) == ("promoted", p.image.digest, "swap")
    s = p.run("status", "--service", p.service)
    assert s.returncode == 0, s.stderr
    assert f"current:  {p.image.ref}" in s.stdout and "active" in s.stdout


# The whole fault x strategy matrix (crash, never ready, failed first generation, garbage,
# slower, stalled, interrupted; swap and side-by-side) runs against the scripted host in
# tests/test_deploy_failures_unit.py. Here, one of each kind on the real host: a crash that
# real systemd and journald report under swap, and a gate verdict measured over real HTTP
# under side-by-side, where the incumbent must not lose a request.
FAILURES = [
    ("swap", "crash", "candidate crashed on start", "no-kernel-image"),
    ("side-by-side", "slower", "slower than the incumbent", None),
    # serves, but its journal shows the fallback its variant rules out: a start failure with that line
    ("swap", "trtllm", "candidate serves, but not on the path its variant claims: the startup log shows "
     "'FlashInfer workspace preflight probe failed' (sglang 0.5.23 srt/layers/flashinfer_comm_fusion.py:368)", None),
]


@pytest.mark.parametrize(("strategy", "variant", "cause", "signature"), FAILURES)
def test_failed_candidate_rolls_back(project: Project, strategy: str, variant: str, cause: str,
                                     signature: str | None) -> None:
    p = project
    before = ensure_incumbent(p)
    with Client(p.port, kind="generate" if strategy == "side-by-side" else "health") as client:
        r = p.deploy(variant, "--strategy", strategy)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "outcome: rolled-back (exit 1)" in out and cause in out, out
    if signature:
        assert f"crash signature: {signature}" in out, out
        assert "No such container" not in out  # docker's noise about the removed container stays out
    assert_incumbent_unchanged(p, before)
    assert p.state()["last_verdict"] in ("fail", "not-ready")
    if strategy == "side-by-side":
        assert client.failed == 0, f"side-by-side lost {client.failed} of {len(client.results)}"
        assert len(client.results) > 5
    else:
        record_figure(scenario=f"swap {variant}", reported_s=reported_downtime(out),
                      client_s=round(client.downtime(), 3), failed_requests=client.failed,
                      requests=len(client.results))
        assert reported_downtime(out) is not None


def test_registry_unreachable_changes_nothing(project: Project) -> None:
    p = project
    ensure_incumbent(p)
    snap = p.snapshot()
    dead = f"127.0.0.1:{free_port()}/stackbuild-deploytest@{p.image.digest}"
    with Client(p.port) as client:
        r = p.deploy("good2", image=dead)
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    assert "cannot pull" in out and "nothing on the host was changed" in out
    assert p.snapshot() == snap
    assert client.failed == 0 and p.serving()


def test_preflight_reports_every_failed_check(project: Project) -> None:
    p = project
    ensure_incumbent(p)
    snap = p.snapshot()
    with socket.socket() as blocker:
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("127.0.0.1", p.staging))
        blocker.listen()
        r = p.deploy("good2", "--strategy", "side-by-side")
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    assert f"port: port {p.staging} is in use" in out
    assert "gpu" not in out.lower().split("preflight", 1)[1].split("\n")[0]  # sim: no GPU checks
    assert p.snapshot() == snap


def test_swap_preflight_failure_lists_every_check_and_loses_nothing(
        project: Project, tmp_path: Path) -> None:
    p = project
    ensure_incumbent(p)
    snap = p.snapshot()
    report = tmp_path / "report.json"
    with Client(p.port) as client:
        r = p.deploy("needgpu", "--json", str(report))
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    # the test host has no NVIDIA runtime and no nvidia-smi: both named in one report
    assert "nvidia runtime: neither the nvidia docker runtime nor an NVIDIA CDI spec" in out
    assert "gpus: nvidia-smi failed" in out
    assert p.snapshot() == snap
    assert client.failed == 0 and len(client.results) > 3
    data = json.loads(report.read_text())
    assert (data["outcome"], data["exit_code"]) == ("refused", 4)
    assert [s["name"] for s in data["steps"]] == ["lock", "state", "preflight"]


def test_unknown_host_key_rejected_with_hint(project: Project, tmp_path: Path) -> None:
    p = project
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    args = p.cmd("status", "--service", p.service)
    args[args.index("--known-hosts") + 1] = str(empty)
    import subprocess

    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 4
    assert "is not in" in r.stderr and f"ssh-keyscan -p {p.host.port} 127.0.0.1" in r.stderr
    assert "--accept-new-host-key" in r.stderr
    r = subprocess.run([*args, "--accept-new-host-key"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"[127.0.0.1]:{p.host.port} ssh-ed25519" in empty.read_text()


def test_dry_run_prints_commands_and_changes_nothing(project: Project) -> None:
    p = project
    ensure_incumbent(p)
    snap = p.snapshot()
    r = p.deploy("good2", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "would run: systemctl start" in r.stdout
    assert "would stop the incumbent" in r.stdout
    assert p.snapshot() == snap


def test_deploy_builds_and_pushes_when_no_image_is_given(project: Project) -> None:
    """`stackbuild deploy STACK --host ...` alone: BuildKit build, push, pull by digest, gate."""
    p = project
    ensure_incumbent(p)
    r = p.deploy(None, "--registry", "127.0.0.1:5000/stackbuild-deploytest", image="")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "outcome: promoted (exit 0)" in out
    cur = p.state()["current"]
    assert isinstance(cur, dict)
    assert str(cur["image"]).startswith("127.0.0.1:5000/stackbuild-deploytest@sha256:")
    assert f"built {cur['image'].split('@')[0]}:simtest-" in out or "already" in out
    from stackbuild.results.ledger import Ledger

    with Ledger(p.ledger) as ledger:  # the image the deploy built is in the builds table, like `build`'s
        assert cur["digest"] in [b.digest for b in ledger.builds()]


def test_dead_peer_fails_in_seconds(project: Project) -> None:
    """A host that accepts TCP but never speaks SSH (frozen): bounded by --connect-timeout."""
    import subprocess

    p = project
    subprocess.run(["/usr/bin/docker", "pause", p.host.container], check=True, timeout=30)
    try:
        t0 = time.monotonic()
        r = p.run("status", "--service", p.service, "--connect-timeout", "2", timeout=60)
        took = time.monotonic() - t0
    finally:
        subprocess.run(["/usr/bin/docker", "unpause", p.host.container], check=True, timeout=30)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "cannot connect" in r.stderr or "SSH to" in r.stderr
    assert took < 20, f"a frozen peer took {took:.1f}s to fail"
