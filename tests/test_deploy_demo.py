"""`stackbuild demo` end to end: build, host container, deploys, gate, results table."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_deploy_support import REPO_ROOT, need_infra

pytestmark = pytest.mark.integration


def test_demo_runs_the_whole_pipeline(tmp_path: Path) -> None:
    need_infra()
    (tmp_path / "stacks").mkdir()
    shutil.copy(REPO_ROOT / "stacks" / "sim.yaml", tmp_path / "stacks" / "sim.yaml")
    name = f"stackbuild-demo-test-{secrets.token_hex(3)}"
    r = subprocess.run(
        [sys.executable, "-m", "stackbuild", "--root", str(tmp_path), "demo", "--remove-host",
         "--host-name", name],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "outcome: promoted (exit 0)" in out
    assert "=== results" in out
    table = out.split("=== results", 1)[1]
    assert "baseline" in table and "slower" in table and "rolled-back" in table
    # the build is in the ledger too, linked to the deploy that promoted it
    builds = table.split("## Builds", 1)[1]
    assert "| sim | `127.0.0.1:5000/stackbuild:sim-" in builds and "promoted on root@127.0.0.1:" in builds
    assert "demo: exit codes: baseline=0, eagle3-topk1-v2=0" in out
    # promoted under the sim stack's policy (C=1 may lose 8%, C>=2 must not lose), and the table says why
    assert "allowed -8%: PASS)" in table and "must not lose (margin 2%): PASS)" in table
    gone = subprocess.run(["/usr/bin/docker", "inspect", name], capture_output=True)
    assert gone.returncode != 0, "--remove-host left the host container behind"
