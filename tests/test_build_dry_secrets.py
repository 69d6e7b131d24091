"""`build --dry-run` keeps its context for reading, so it must hold no secret value (issue 10, item 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# the real CLI assembles a whole context (wheelhouse): seconds, so with the integration tests
pytestmark = pytest.mark.integration


def test_dry_run_context_holds_no_secret(tmp_path: Path) -> None:
    token = "hf_dryrun_" + os.urandom(8).hex()
    env = {**os.environ, "HF_TOKEN": token, "STACKBUILD_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "stackbuild", "build", "sim", "--dry-run"], capture_output=True,
                       text=True, timeout=600, env=env)  # ~20 s; far above, for a loaded machine
    assert r.returncode == 0, r.stderr
    assert "id=hf_token" in r.stdout + r.stderr  # the command still names the secret it would mount
    kept = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert kept, "the dry run keeps its context"
    for p in kept:
        assert token.encode() not in p.read_bytes(), f"the secret value landed in {p}"
    assert token not in r.stdout + r.stderr
