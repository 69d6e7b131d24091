"""Everything local is checked before the host changes (issue 10, items 4 and 9), on the real host:
output paths, validate's checks, and the connection + host key before a build."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from test_deploy_support import (
    Project,
    deploy_host,  # noqa: F401  (fixture)
    project_fixture,
    sim_image,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.integration
ONE_LINE = re.compile(r"^stackbuild: .+$|^\S+:\d+:\d+: error: .+$")


project = project_fixture("localfirst", deployed=True)


def _refused_untouched(p: Project, args: list[str], code: int, needle: str) -> None:
    snap = p.snapshot()
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=p.root)
    assert r.returncode == code, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines and all(ONE_LINE.match(ln) for ln in lines), r.stderr
    assert needle in r.stderr
    assert "lock" not in r.stdout  # no deploy step ran
    assert p.snapshot() == snap and p.serving()


def test_unwritable_json_refused_before_the_host(project: Project, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    args = [*project.cmd("deploy", "simtest", "--variant", "good2"), "--json", str(blocker / "report.json")]
    _refused_untouched(project, args, 2, "--json")


def test_corrupt_ledger_refused_before_the_host(project: Project, tmp_path: Path) -> None:
    bad = tmp_path / "ledger.db"
    bad.write_bytes(b"this is not sqlite " * 100)
    args = project.cmd("deploy", "simtest", "--variant", "good2")
    args[args.index("--ledger") + 1] = str(bad)
    _refused_untouched(project, args, 2, "not a stackbuild ledger")
    assert bad.read_bytes() == b"this is not sqlite " * 100


def test_spec_that_validate_rejects_is_not_deployed(project: Project) -> None:
    _refused_untouched(project, project.cmd("deploy", "simtest", "--variant", "badflag"), 2, "--no-such-flag")


def test_host_key_checked_before_a_build(project: Project, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    args = project.cmd("deploy", "simtest", "--variant", "good2", image="")  # no --image: would build
    args[args.index("--known-hosts") + 1] = str(empty)
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=project.root)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "is not in" in r.stderr
    assert "built " not in r.stdout + r.stderr and "#1 " not in r.stdout + r.stderr  # no BuildKit output
