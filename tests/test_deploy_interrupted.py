"""Deploys interrupted on the real host: a second deploy racing for the lock, stackbuild
SIGKILLed mid-deploy, the SSH sessions killed mid-deploy, and `stackbuild rollback`.

Apart from tests/test_deploy_host.py so the two run on separate test workers; each has its
own project (service) on the worker's host.
"""

from __future__ import annotations

import signal
import subprocess

import pytest
from test_deploy_support import (
    HostBox,
    Project,
    assert_incumbent_unchanged,
    deploy_host,  # noqa: F401  (fixture)
    ensure_incumbent,
    pending_on,
    project_fixture,
    sim_image,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.integration


project = project_fixture("interrupted")


def _pending(p: Project) -> bool:
    st = p.state()
    return bool(st.get("pending"))


def _swap_started(p: Project) -> subprocess.Popen[str]:
    """A slow-loading swap deploy, returned once it marked the host and started its candidate."""
    proc = p.popen("slowload", "--strategy", "swap")
    started = f"{pending_on(p.service)} && systemctl is-active {p.service} | grep -qx -e active -e activating"
    assert p.host.until(started, 300, unless=proc), "the candidate never started"
    return proc


def test_concurrent_deploy_refused_by_lock(project: Project) -> None:
    p = project
    ensure_incumbent(p)
    first = p.popen("slowload")
    try:
        assert p.host.until(pending_on(p.service), 300, unless=first), "the first deploy never started"
        second = p.deploy("good2")
        out = second.stdout + second.stderr
        assert second.returncode == 4, out
        assert "another deploy holds the host lease" in out and f"pid {first.pid}" in out
    finally:
        out1, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out1
    assert "--load-s 5" in p.unit_text()


def test_stackbuild_killed_mid_deploy_rerun_converges(project: Project) -> None:
    p = project
    before = ensure_incumbent(p)
    proc = _swap_started(p)
    # anywhere from here the kill leaves the marker and the lock behind; no need to aim
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert p.host.sh(f"test -d /var/lib/stackbuild/{p.service}/lock").returncode == 0
    assert _pending(p)
    r = p.deploy("good2")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "broke a stale lock" in out and "recover" in out
    st = p.state()
    assert st["previous"] == before["current"] and st.get("pending") is None
    assert p.serving()


def _kill_ssh_sessions(host: HostBox) -> int:
    ps = host.sh("ps -eo pid=,args=").stdout.splitlines()
    pids = [ln.split()[0] for ln in ps if "sshd:" in ln and "root@" in ln]
    for pid in pids:
        host.sh(f"kill -9 {pid}")
    return len(pids)


def test_ssh_killed_mid_deploy_restores_then_rerun_converges(project: Project) -> None:
    p = project
    before = ensure_incumbent(p)
    proc = _swap_started(p)
    assert _kill_ssh_sessions(p.host) >= 1
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 4, out
    assert "SSH connection" in out and "lost" in out
    assert "reconnecting once to restore the host" in out
    assert_incumbent_unchanged(p, before)
    r = p.deploy("slowload")
    assert r.returncode == 0, r.stdout + r.stderr
    assert p.state()["previous"] == before["current"]


def test_rollback_to_previous_digest(project: Project) -> None:
    p = project
    ensure_incumbent(p)
    r = p.deploy("good2")
    assert r.returncode == 0, r.stdout + r.stderr
    # a swap: its gate compared with the incumbent measured right before, and says over how long
    # a restart (what `gate --plan` reads the machine's walk with)
    from stackbuild.results.ledger import Ledger

    with Ledger(p.ledger) as ledger:
        compared = [g.result for g in ledger.gate_runs() if g.result.baseline_source == "stored"]
    assert compared and all(lv.swap_gap is not None and lv.swap_gap >= 0 for lv in compared[-1].levels)
    st = p.state()
    r = p.run("rollback", "--service", p.service)
    assert r.returncode == 0, r.stdout + r.stderr
    after = p.state()
    assert after["current"] == st["previous"] and after["previous"] == st["current"]
    assert p.serving()
    assert "--seed 1" not in p.unit_text()
