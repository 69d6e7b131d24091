"""Issue 10, item 10, on the real host: ownerless locks go stale, status shows a held lock,
broken locks do not pile up, status finds the service, a missing key file is named, and a
crash report carries no `docker logs` noise for the container the unit removed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_deploy_support import (
    Project,
    deploy_host,  # noqa: F401  (fixture)
    project_fixture,
    sim_image,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.integration


project = project_fixture("small", deployed=True)


def _cli(p: Project, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "stackbuild", args[0], *p.host.ssh_args(), *args[1:]]  # ours win
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_status_shows_a_held_lock(project: Project) -> None:
    p = project
    lock = f"/var/lib/stackbuild/{p.service}/lock"
    owner = '{"host": "elsewhere", "pid": 7, "started": 1, "what": "deploy other"}'
    p.host.sh(f"mkdir -p {lock} && printf '%s' '{owner}' > {lock}/owner.json")
    try:
        s = _cli(p, "status", "--service", p.service)
        assert "LOCKED: deploy other by pid 7 on elsewhere" in s.stdout, s.stdout + s.stderr
    finally:
        p.host.sh(f"rm -rf {lock}")
    assert "LOCKED" not in _cli(p, "status", "--service", p.service).stdout


def test_status_finds_the_one_service_or_asks(project: Project) -> None:
    p = project
    p.host.sh("rm -rf /tmp/sb-sd1 /tmp/sb-sd2 && mkdir -p /tmp/sb-sd1/alpha /tmp/sb-sd2/alpha /tmp/sb-sd2/beta")
    one = _cli(p, "status", "--state-dir", "/tmp/sb-sd1")
    assert one.returncode == 0 and " alpha: NOT active" in one.stdout, one.stdout + one.stderr
    two = _cli(p, "status", "--state-dir", "/tmp/sb-sd2")
    assert two.returncode == 2 and "several services (alpha, beta); pass --service NAME" in two.stderr
    none = _cli(p, "rollback", "--state-dir", "/tmp/sb-sd-none")
    assert none.returncode == 2 and "no stackbuild service under /tmp/sb-sd-none" in none.stderr


def test_missing_identity_file_is_named(project: Project, tmp_path: Path) -> None:
    r = _cli(project, "status", "--service", project.service, "--identity", str(tmp_path / "nope"))
    assert r.returncode == 2 and "--identity" in r.stderr and "no such key file" in r.stderr


